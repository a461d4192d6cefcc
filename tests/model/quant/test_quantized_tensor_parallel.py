"""Quantized linears under tensor parallelism (two gloo ranks): a GPTQ checkpoint's ranks load their
slices of packed codes, scales and act-order groups and give TP=1's greedy tokens; int8 at load runs."""
from __future__ import annotations

from pathlib import Path

import pytest

from folovllm import LLM, SamplingParams
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (fixture)

PROMPTS = [{"prompt_token_ids": p} for p in ([5, 17, 3, 99, 42, 7], [250, 11, 64, 1, 300, 2, 18, 6])]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _tokens(model: str, **kwargs) -> list[list[int]]:
    llm = LLM(model, dtype="float32", block_size=4, max_model_len=256, num_gpu_blocks_override=64, **kwargs)
    try:
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("desc_act", [False, True])
def test_gptq_two_ranks_give_the_tokens_of_one(tiny_llama, tmp_path: Path, desc_act: bool) -> None:  # noqa: F811
    gptq_dir, _ = make_gptq_model(tiny_llama, tmp_path, group_size=32, desc_act=desc_act)
    assert _tokens(gptq_dir, tensor_parallel_size=2) == _tokens(gptq_dir)


def test_int8_at_load_runs_on_two_ranks(tiny_llama, tmp_path: Path) -> None:  # noqa: F811
    _, dense_dir = make_gptq_model(tiny_llama, tmp_path)
    # each rank quantizes its own slice (row-parallel scales span half a row), so tokens may differ from TP=1
    tokens = _tokens(dense_dir, tensor_parallel_size=2, quantization="int8")
    assert [len(t) for t in tokens] == [8, 8]
