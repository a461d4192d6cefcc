"""The C++ layer chain (model/layer_chain.py): decode steps through one call give the direct layers' logits
bit for bit (bf16, int4 with and without the fused MLP, int8, float32); prefill steps, hooks and linears
it does not take go through the direct layers; the switch."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from folovllm.kernel_libraries import CPU_DECODER_CHAIN_LIBRARY, cpu_decoder_chain_available
from folovllm.model.layer_chain import LAYER_CHAIN_ENV, layer_chain_enabled
from folovllm.model.layers import CausalLM
from folovllm.model.loader import load_model
from folovllm.model.quant.cpu_quant import cpu_quant_unavailable
from folovllm.model.quant.gptq_config import INT4_FUSED_MLP_ENV
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (a fixture)
from tests.model.test_direct import ENGINE_OPS, NOT_BUILT, prefill_then_decode
from tests.model.test_model_vs_hf import CONFIGS

torch.set_num_threads(2)
pytestmark = [pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}"),
              pytest.mark.skipif(NOT_BUILT is None and not cpu_decoder_chain_available(CPU_DECODER_CHAIN_LIBRARY),
                                 reason="the CPU decoder layer chain is not built (make kernels)")]
NO_QUANT = cpu_quant_unavailable()


@pytest.fixture(scope="module")
def folders(tiny_llama, tmp_path_factory) -> tuple[str, str]:  # noqa: F811
    """(GPTQ 4-bit g32 folder, float folder of the same dequantized weights)."""
    return make_gptq_model(tiny_llama, tmp_path_factory.mktemp("chain"))


def chain_and_direct(model: CausalLM) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(logits with the chain, logits with the direct layers alone, steps the chain ran)."""
    chain = model.model.layer_chain
    assert chain is not None
    runs, run = [], chain._run
    chain._run = lambda *args: runs.append(1) or run(*args)
    with_chain = prefill_then_decode(model)
    model.model.layer_chain = None
    direct = prefill_then_decode(model)
    model.model.layer_chain = chain
    return with_chain, direct, len(runs)


def test_bf16_decode_through_the_chain_equals_direct_calls(folders: tuple[str, str]) -> None:
    model = load_model(folders[1], dtype=torch.bfloat16, device="cpu", cpu_bf16_linear=True, **ENGINE_OPS)
    with_chain, direct, runs = chain_and_direct(model)
    assert runs == 1  # the decode step; the prefill went through the direct layers
    assert torch.equal(with_chain, direct)


@pytest.mark.skipif(NO_QUANT is not None, reason=f"{NO_QUANT}")
@pytest.mark.parametrize("fused_mlp", ["on", "off"])
def test_gptq_int4_with_int8_head_through_the_chain(folders: tuple[str, str], fused_mlp: str, monkeypatch) -> None:
    monkeypatch.setenv(INT4_FUSED_MLP_ENV, fused_mlp)
    model = load_model(folders[0], dtype=torch.bfloat16, device="cpu", quantize_lm_head="on", **ENGINE_OPS)
    with_chain, direct, runs = chain_and_direct(model)
    assert runs == 1
    assert torch.equal(with_chain, direct)


@pytest.mark.skipif(NO_QUANT is not None, reason=f"{NO_QUANT}")
def test_int8_and_float32_int4_through_the_chain(folders: tuple[str, str]) -> None:
    for model in (load_model(folders[1], dtype=torch.bfloat16, device="cpu", quantization="int8", **ENGINE_OPS),
                  load_model(folders[0], dtype=torch.float32, device="cpu", **ENGINE_OPS)):
        with_chain, direct, runs = chain_and_direct(model)
        assert runs == 1
        assert torch.equal(with_chain, direct)


def test_linears_it_does_not_take_and_hooks_keep_the_direct_layers(folders: tuple[str, str]) -> None:
    onednn = load_model(folders[1], dtype=torch.bfloat16, device="cpu", cpu_bf16_linear=False, **ENGINE_OPS)
    assert onednn.model.direct_layers is not None and onednn.model.layer_chain is None
    model = load_model(folders[1], dtype=torch.bfloat16, device="cpu", cpu_bf16_linear=True, **ENGINE_OPS)
    runs, run = [], model.model.layer_chain._run
    model.model.layer_chain._run = lambda *args: runs.append(1) or run(*args)
    handle = model.model.layers[0].self_attn.register_forward_hook(lambda m, args, out: None)
    hooked = prefill_then_decode(model)
    handle.remove()
    assert runs == []
    assert torch.equal(hooked, prefill_then_decode(model))
    assert runs == [1]


def test_switch(folders: tuple[str, str], monkeypatch) -> None:
    monkeypatch.setenv(LAYER_CHAIN_ENV, "off")
    model = load_model(folders[1], dtype=torch.bfloat16, device="cpu", cpu_bf16_linear=True, **ENGINE_OPS)
    assert model.model.direct_layers is not None and model.model.layer_chain is None
    monkeypatch.setenv(LAYER_CHAIN_ENV, "yes")
    with pytest.raises(ValueError, match=LAYER_CHAIN_ENV):
        layer_chain_enabled()


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
    model = load_model(str(tmp_path), dtype=torch.bfloat16, device="cpu", cpu_bf16_linear=True, **ENGINE_OPS)
    with_chain, direct, runs = chain_and_direct(model)
    assert runs == 1
    assert torch.equal(with_chain, direct)
