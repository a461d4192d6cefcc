"""The cpu_prepack switch end to end (oneDNN packing: cpu_bf16_linear off): it reaches the model, and greedy
tokens do not change with it."""
import pytest
import torch

from folovllm import LLM, SamplingParams
from folovllm.model.cpu_packed import PackedLinearMethod, cpu_prepack_supported
from folovllm.model.linear import LinearBase
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401

pytestmark = pytest.mark.skipif(not cpu_prepack_supported(torch.bfloat16, torch.device("cpu")),
                                reason="oneDNN bf16 packing is unavailable on this CPU")


def packed_layers(llm: LLM) -> set[bool]:
    model = llm.llm_engine.worker.model
    return {isinstance(m.method, PackedLinearMethod) for m in model.modules() if isinstance(m, LinearBase)}


def test_switch_reaches_the_model_and_keeps_greedy_tokens(tiny_llama_dir) -> None:  # noqa: F811
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, seed=7)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = {}
    for prepack in (True, False):
        llm = make_llm(tiny_llama_dir, dtype="bfloat16", cpu_prepack=prepack, cpu_bf16_linear=False)
        assert packed_layers(llm) == {prepack}
        assert (llm.llm_engine.worker.model.lm_head.weight.is_mkldnn) == prepack
        tokens[prepack] = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens[True] == tokens[False]


@pytest.mark.slow
def test_default_model_greedy_tokens_equal_with_and_without_prepack() -> None:
    prompts = ["The capital of France is", "def fibonacci(n):", "List three colors:\n1."]
    params = SamplingParams(temperature=0, max_tokens=24)
    tokens = {}
    for prepack in (True, False):
        llm = LLM(dtype="bfloat16", device="cpu", max_model_len=256, kv_cache_memory="64MiB", cpu_prepack=prepack,
                  cpu_bf16_linear=False)
        assert packed_layers(llm) == {prepack}
        tokens[prepack] = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
        del llm
    assert tokens[True] == tokens[False]
