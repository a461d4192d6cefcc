"""Direct decoder-layer calls (model/direct.py): the same logits as the module calls, bit for bit; the
modules whenever a hook is registered; the switch and the layers it cannot stand in for."""
from __future__ import annotations

import pytest
import torch

from folovllm.kernel_libraries import CPU_ATTENTION_LIBRARY, CPU_FUSED_OPS_LIBRARY, load_cpu_attention_library, load_cpu_fused_ops_library
from folovllm.model.direct import DIRECT_CALLS_ENV, direct_calls_enabled
from folovllm.model.layers import CausalLM
from folovllm.model.loader import load_model
from folovllm.model.quant.cpu_quant import cpu_quant_unavailable
from folovllm.model.quant.gptq_config import INT4_ACTIVATIONS_ENV, INT4_FUSED_MLP_ENV
from tests.helpers import make_attn_metadata
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (a fixture)

torch.set_num_threads(2)
NOT_BUILT = load_cpu_fused_ops_library(CPU_FUSED_OPS_LIBRARY) or load_cpu_attention_library(CPU_ATTENTION_LIBRARY)
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")
ENGINE_OPS = {"attn_backend": "cpu", "cpu_fused_ops": True, "cpu_prepack": True}
BLOCK = 16


def prefill_then_decode(model: CausalLM) -> torch.Tensor:
    """Logits of a two-prompt prefill (13 and 5 tokens) and then of one decode step of both."""
    arch, lens = model.arch, [13, 5]
    tables = [[0, 1], [2, 3]]
    shape = (4, BLOCK, arch.num_key_value_heads, arch.head_dim)
    caches = [(torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype))
              for _ in range(arch.num_hidden_layers)]
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        ids = torch.randint(3, 500, (sum(lens),), generator=gen)
        positions = torch.cat([torch.arange(n) for n in lens])
        hidden = model(ids, positions, caches, make_attn_metadata(lens, lens, tables, BLOCK))
        prefill = model.compute_logits(hidden)
        meta = make_attn_metadata([1, 1], [n + 1 for n in lens], tables, BLOCK)
        decode = model.compute_logits(model(torch.tensor([7, 9]), torch.tensor(lens), caches, meta))
    return torch.cat([prefill, decode])


def both_ways(model: CausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits with direct calls, logits through the modules)."""
    assert model.model.direct_layers is not None
    direct = prefill_then_decode(model)
    model.model.use_direct_calls(False)
    assert model.model.direct_layers is None
    modules = prefill_then_decode(model)
    model.model.use_direct_calls(True)
    return direct, modules


@pytest.fixture(scope="module")
def folders(tiny_llama, tmp_path_factory) -> tuple[str, str]:  # noqa: F811
    """(GPTQ 4-bit g32 folder, float folder of the same dequantized weights)."""
    return make_gptq_model(tiny_llama, tmp_path_factory.mktemp("direct"))


@pytest.mark.skipif(cpu_quant_unavailable() is not None, reason=f"{cpu_quant_unavailable()}")
@pytest.mark.parametrize("activations", ["bf16", "int8", "auto"])  # auto: int8 in the 18-row prefill only
def test_gptq_int4_with_int8_head_equals_module_calls(folders: tuple[str, str], activations: str,
                                                      monkeypatch) -> None:
    """Also the fused int4 MLP (one op for gate_up, SiLU-mul and down): the three ops' logits bit for bit."""
    if activations != "bf16" and not torch.ops.folovllm_cpu_quant.supported_a8():
        pytest.skip("this CPU lacks AVX512_VNNI")
    monkeypatch.setenv(INT4_ACTIVATIONS_ENV, activations)
    model = load_model(folders[0], dtype=torch.bfloat16, device="cpu", quantize_lm_head="on", **ENGINE_OPS)
    assert all(layer.mlp is not None for layer in model.model.direct_layers)
    direct, modules = both_ways(model)
    assert torch.equal(direct, modules)


@pytest.mark.skipif(cpu_quant_unavailable() is not None, reason=f"{cpu_quant_unavailable()}")
def test_fused_int4_mlp_switch(folders: tuple[str, str], monkeypatch) -> None:
    monkeypatch.setenv(INT4_FUSED_MLP_ENV, "off")
    model = load_model(folders[0], dtype=torch.bfloat16, device="cpu", **ENGINE_OPS)
    assert all(layer.mlp is None for layer in model.model.direct_layers)
    monkeypatch.setenv(INT4_FUSED_MLP_ENV, "on")
    fused = load_model(folders[0], dtype=torch.bfloat16, device="cpu", **ENGINE_OPS)
    assert torch.equal(prefill_then_decode(model), prefill_then_decode(fused))
    float_model = load_model(folders[1], dtype=torch.bfloat16, device="cpu", **ENGINE_OPS)
    assert all(layer.mlp is None for layer in float_model.model.direct_layers)  # not int4: three calls


@pytest.mark.parametrize("bf16_linear", [False, True])
def test_bf16_equals_module_calls(folders: tuple[str, str], bf16_linear: bool) -> None:
    model = load_model(folders[1], dtype=torch.bfloat16, device="cpu", cpu_bf16_linear=bf16_linear, **ENGINE_OPS)
    direct, modules = both_ways(model)
    assert torch.equal(direct, modules)


@pytest.mark.skipif(cpu_quant_unavailable() is not None, reason=f"{cpu_quant_unavailable()}")
def test_int8_linears_equal_module_calls(folders: tuple[str, str]) -> None:
    model = load_model(folders[1], dtype=torch.bfloat16, device="cpu", quantization="int8", **ENGINE_OPS)
    direct, modules = both_ways(model)
    assert torch.equal(direct, modules)


def test_a_registered_hook_sends_the_step_through_the_modules(folders: tuple[str, str]) -> None:
    model = load_model(folders[1], dtype=torch.bfloat16, device="cpu", **ENGINE_OPS)
    seen = []
    handle = model.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    hooked = prefill_then_decode(model)
    handle.remove()
    assert len(seen) == 2  # the prefill and the decode step
    assert torch.equal(hooked, prefill_then_decode(model))
    assert len(seen) == 2  # removed: direct again


def test_switch_off_and_layers_without_a_direct_form(folders: tuple[str, str], monkeypatch) -> None:
    monkeypatch.setenv(DIRECT_CALLS_ENV, "off")
    assert load_model(folders[1], dtype=torch.bfloat16, device="cpu", **ENGINE_OPS).model.direct_layers is None
    monkeypatch.setenv(DIRECT_CALLS_ENV, "on")
    unfused = load_model(folders[1], dtype=torch.bfloat16, device="cpu", cpu_prepack=True)
    assert unfused.model.direct_layers is None  # the torch norms and rotary: the modules' own paths
    monkeypatch.setenv(DIRECT_CALLS_ENV, "yes")
    with pytest.raises(ValueError, match=DIRECT_CALLS_ENV):
        direct_calls_enabled()


def test_float32_gptq_equals_module_calls(folders: tuple[str, str]) -> None:
    model = load_model(folders[0], dtype=torch.float32, device="cpu", **ENGINE_OPS)
    direct, modules = both_ways(model)
    assert torch.equal(direct, modules)

