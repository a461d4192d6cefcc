"""The C++ layer chain (compilation/layer_chain.py): decode steps through one call give the direct layers'
logits bit for bit (bf16 on every linear kernel this tier has, int4 with and without the fused MLP, int8,
float32); prefill steps, hooks and linears it does not take go through the direct layers; the switch."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from folovllm.model.layers import CausalLM
from tests.helpers import cpu_model
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (a fixture)
from tests.model.test_direct import NOT_BUILT, prefill_then_decode
from tests.model.test_model_vs_hf import CONFIGS
from tests.tiers import kernel_missing

torch.set_num_threads(2)
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")
NO_QUANT = kernel_missing("int4")
CHAIN = {"CPU_DECODER": "chain"}


def chain_model(path: str, dtype: torch.dtype, switch_values: dict | None = None, **load_kwargs) -> CausalLM:
    return cpu_model(path, dtype, {**CHAIN, **(switch_values or {})}, attn_backend="cpu", **load_kwargs)


@pytest.fixture(scope="module")
def folders(tiny_llama, tmp_path_factory) -> tuple[str, str]:  # noqa: F811
    """(GPTQ 4-bit g32 folder, float folder of the same dequantized weights)."""
    return make_gptq_model(tiny_llama, tmp_path_factory.mktemp("chain"))


def chain_and_direct(model: CausalLM) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(logits with the chain, logits with the direct layers alone, steps the chain ran)."""
    compiled = model.model.layers.compiled
    chain = compiled.chain
    assert chain is not None
    runs, run = [], chain._run
    chain._run = lambda *args: runs.append(1) or run(*args)
    with_chain = prefill_then_decode(model)
    compiled.chain = None
    direct = prefill_then_decode(model)
    compiled.chain = chain
    return with_chain, direct, len(runs)


@pytest.mark.parametrize("linear", ["auto", "torch"])
def test_bf16_decode_through_the_chain_equals_direct_calls(folders: tuple[str, str], linear: str) -> None:
    model = chain_model(folders[1], torch.bfloat16, {"CPU_LINEAR": linear})
    with_chain, direct, runs = chain_and_direct(model)
    assert runs == 1  # the decode step; the prefill went through the direct layers
    assert torch.equal(with_chain, direct)


@pytest.mark.skipif(NO_QUANT is not None, reason=f"{NO_QUANT}")
def test_gptq_int4_with_int8_head_through_the_chain(folders: tuple[str, str]) -> None:
    model = chain_model(folders[0], torch.bfloat16, quantize_lm_head="on")
    with_chain, direct, runs = chain_and_direct(model)
    assert runs == 1
    assert torch.equal(with_chain, direct)


@pytest.mark.skipif(NO_QUANT is not None, reason=f"{NO_QUANT}")
def test_int8_and_float32_int4_through_the_chain(folders: tuple[str, str]) -> None:
    for model in (chain_model(folders[1], torch.bfloat16, quantization="int8"),
                  chain_model(folders[0], torch.float32)):
        with_chain, direct, runs = chain_and_direct(model)
        assert runs == 1
        assert torch.equal(with_chain, direct)


def test_linears_it_does_not_take_and_hooks_keep_the_direct_layers(folders: tuple[str, str]) -> None:
    onednn = chain_model(folders[0], torch.float32, {"CPU_LINEAR": "onednn", "QUANT_KERNEL": "reference"})
    assert onednn.model.layers.compiled.direct and onednn.model.layers.compiled.chain is None
    model = chain_model(folders[1], torch.bfloat16)
    runs, run = [], model.model.layers.compiled.chain._run
    model.model.layers.compiled.chain._run = lambda *args: runs.append(1) or run(*args)
    handle = model.model.layers[0].self_attn.register_forward_hook(lambda m, args, out: None)
    hooked = prefill_then_decode(model)
    handle.remove()
    assert runs == []
    assert torch.equal(hooked, prefill_then_decode(model))
    assert runs == [1]


def test_switch(folders: tuple[str, str]) -> None:
    model = chain_model(folders[1], torch.bfloat16, {"CPU_DECODER": "direct"})
    assert model.model.layers.compiled.direct and model.model.layers.compiled.chain is None


@pytest.mark.parametrize("config_name", ["qwen2", "qwen3"])  # biases on q/k/v; per-head q/k norms
def test_qwen_layers_through_the_chain(config_name: str, tmp_path) -> None:
    torch.manual_seed(0)
    config = CONFIGS[config_name]()
    config.vocab_size = 512  # prefill_then_decode's token ids
    hf_model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            param.copy_(1 + 0.1 * torch.randn_like(param) if "norm" in name else 0.1 * torch.randn_like(param))
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    model = chain_model(str(tmp_path), torch.bfloat16)
    with_chain, direct, runs = chain_and_direct(model)
    assert runs == 1
    assert torch.equal(with_chain, direct)
