"""oneDNN packing (FOLOVLLM_CPU_LINEAR=onednn against torch's plain F.linear) end to end: it reaches the
model, and greedy tokens do not change with it."""
import pytest
import torch

from folovllm import LLM, SamplingParams
from folovllm.model.layers.linear import LinearBase
from folovllm.model.quantization.packed import PackedLinearMethod
from folovllm.platforms import platform_for
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401
from tests.helpers import switches


def skip_unless_onednn_takes(dtype: torch.dtype) -> None:
    if platform_for("cpu").linear_kernels(dtype).dense_fallback != "onednn":
        pytest.skip(f"oneDNN does not take {dtype} weights at this CPU's tier")


def packed_layers(llm: LLM) -> set[bool]:
    model = llm.llm_engine.worker.model
    return {isinstance(m.method, PackedLinearMethod) for m in model.modules() if isinstance(m, LinearBase)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_switch_reaches_the_model_and_keeps_greedy_tokens(tiny_llama_dir, dtype: torch.dtype) -> None:  # noqa: F811
    skip_unless_onednn_takes(dtype)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, seed=7)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = {}
    for linear in ("onednn", "torch"):
        with switches(CPU_LINEAR=linear):
            llm = make_llm(tiny_llama_dir, dtype=str(dtype).removeprefix("torch."))
        assert packed_layers(llm) == {linear == "onednn"}
        assert llm.llm_engine.worker.model.lm_head.weight.is_mkldnn == (linear == "onednn")
        tokens[linear] = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens["onednn"] == tokens["torch"]


@pytest.mark.slow
def test_default_model_greedy_tokens_equal_with_and_without_prepack() -> None:
    skip_unless_onednn_takes(torch.bfloat16)
    prompts = ["The capital of France is", "def fibonacci(n):", "List three colors:\n1."]
    params = SamplingParams(temperature=0, max_tokens=24)
    tokens = {}
    for linear in ("onednn", "torch"):
        with switches(CPU_LINEAR=linear):
            # the dense linears: by default the GGUF file's own types run, which no dense kernel touches
            llm = LLM(dtype="bfloat16", device="cpu", max_model_len=256, kv_cache_memory="64MiB",
                      load_quantized="off")
        assert packed_layers(llm) == {linear == "onednn"}
        tokens[linear] = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
        del llm
    assert tokens["onednn"] == tokens["torch"]
