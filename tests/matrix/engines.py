"""What every case of the feature matrix shares: the devices a case runs on, an engine's settings there, the
default model's tokenizer beside a test model, and counting the decode steps a CUDA graph ran."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from folovllm import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
# The default model's tokenizer as the GPU check carries it (the model package itself is too large to carry):
# scripts/gpu_check.sh --fetch-wheels writes it beside the wheels.
CARRIED_TOKENIZER = ROOT / ".whl" / "default-tokenizer"
# Each case once on the CPU (its twin: the same code, small and fast) and once on the GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])]


def engine(model_dir: str, device: str, **settings) -> LLM:
    """An engine for a tiny model on ``device``: fp32 (comparisons against transformers stay exact up to
    near-ties), few KV blocks and sequences (few CUDA graphs to capture), and whatever ``settings`` change."""
    defaults = dict(device=device, dtype="float32", block_size=16, max_model_len=256, max_num_seqs=8,
                    num_gpu_blocks_override=128, seed=0)
    return LLM(model_dir, **{**defaults, **settings})


def greedy(max_tokens: int, **fields) -> SamplingParams:
    """Greedy to a fixed length, with the top-2 logprobs the tolerance rule reads."""
    return SamplingParams(**{"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 2,
                             **fields})


def hf_model(model_dir: str, device: str) -> torch.nn.Module:
    """transformers' own model of ``model_dir`` in fp32 on ``device``: the reference on the same device."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()


def token_prompts(count: int, seed: int, low: int, high: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=gen).tolist()
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def with_tokenizer(model_dir: str, tokenizer_dir: Path, dest: Path) -> str:
    """A copy of ``model_dir`` with the default model's tokenizer files in place of its own."""
    shutil.copytree(model_dir, dest)
    for path in tokenizer_dir.iterdir():
        shutil.copy(path, dest / path.name)
    return str(dest)


def count_graph_replays(llm: LLM) -> list[int]:
    """A one-item list counting the decode steps replayed as a CUDA graph from now on (none on the CPU)."""
    count = [0]
    graphs = llm.llm_engine.worker.runner.cuda_graphs
    if graphs is None:
        return count
    replay = graphs.run

    def counted(*args, **kwargs):
        count[0] += 1
        return replay(*args, **kwargs)

    graphs.run = counted
    return count
