"""Quantized models through the engine (LLM offline API): greedy decoding end to end."""
from __future__ import annotations

from pathlib import Path

import torch

from folovllm import LLM, SamplingParams
from folovllm.model.loader import load_model
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (fixture)
from tests.model.test_loader import prefill_logits
from tests.tolerance import assert_greedy_match, top2_gaps

PROMPTS = [[5, 17, 3, 99, 42], [7, 250, 11, 64, 1, 300, 2, 18, 33], [400, 401]]


def _greedy(model_dir: str, **kwargs) -> list[list[int]]:
    llm = LLM(model_dir, dtype="float32", block_size=4, max_model_len=128, num_gpu_blocks_override=128, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_gptq_engine_greedy_matches_dequantized_model(tiny_llama, tmp_path: Path) -> None:  # noqa: F811
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path, bits=4, group_size=32, sym=False, desc_act=True)
    ours = _greedy(gptq_dir, quantization="gptq")
    reference = _greedy(dense_dir)
    dense = load_model(dense_dir, dtype=torch.float32, device="cpu")
    for prompt, got, expected in zip(PROMPTS, ours, reference):
        logits = prefill_logits(dense, prompt + expected)[len(prompt) - 1:-1]
        assert_greedy_match(got, expected, top2_gaps(list(logits)))


def test_int8_engine_greedy_kernel_matches_reference(tiny_llama, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    _, dense_dir = make_gptq_model(tiny_llama, tmp_path)
    ours = _greedy(dense_dir, quantization="int8")
    monkeypatch.setenv("FOLOVLLM_QUANT_KERNEL", "reference")
    assert ours == _greedy(dense_dir, quantization="int8")
    assert all(len(tokens) == 12 for tokens in ours)
