"""Direct decoder-layer calls (compilation/direct.py): the same logits as the module calls, bit for bit; the
modules whenever a hook is registered; the switch and the layers it cannot stand in for."""
from __future__ import annotations

import pytest
import torch

from folovllm.compilation.cpu import CompiledDecoder
from folovllm.model.layers import CausalLM
from folovllm.platforms import kernel_library
from tests.helpers import cpu_model, make_attn_metadata
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (a fixture)
from tests.tiers import kernel_missing, library_missing

torch.set_num_threads(2)
NOT_BUILT = library_missing()
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")
DIRECT = {"CPU_DECODER": "direct"}  # direct calls for every step, no C++ chain
BLOCK = 16


def direct_model(path: str, dtype: torch.dtype, switch_values: dict | None = None, **load_kwargs) -> CausalLM:
    return cpu_model(path, dtype, {**DIRECT, **(switch_values or {})}, attn_backend="cpu", **load_kwargs)


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
    stack = model.model.layers
    compiled = stack.compiled
    assert isinstance(compiled, CompiledDecoder) and compiled.chain is None
    direct = prefill_then_decode(model)
    stack.compiled = None
    modules = prefill_then_decode(model)
    stack.compiled = compiled
    return direct, modules


@pytest.fixture(scope="module")
def folders(tiny_llama, tmp_path_factory) -> tuple[str, str]:  # noqa: F811
    """(GPTQ 4-bit g32 folder, float folder of the same dequantized weights)."""
    return make_gptq_model(tiny_llama, tmp_path_factory.mktemp("direct"))


@pytest.mark.skipif(kernel_missing("int4") is not None, reason=f"{kernel_missing('int4')}")
@pytest.mark.parametrize("activations", ["bf16", "int8", "auto"])  # auto: int8 in the 18-row prefill only
def test_gptq_int4_with_int8_head_equals_module_calls(folders: tuple[str, str], activations: str) -> None:
    """Also the fused int4 MLP (one op for gate_up, SiLU-mul and down): the three ops' logits bit for bit."""
    if activations != "bf16" and not kernel_library.has_kernel("int4_a8"):
        pytest.skip("this CPU lacks AVX512_VNNI")
    model = direct_model(folders[0], torch.bfloat16, {"INT4_ACTIVATIONS": activations}, quantize_lm_head="on")
    assert all(layer.mlp is not None for layer in model.model.layers.compiled.direct)
    direct, modules = both_ways(model)
    assert torch.equal(direct, modules)


@pytest.mark.skipif(kernel_missing("int4") is not None, reason=f"{kernel_missing('int4')}")
def test_the_fused_int4_mlp_is_only_for_int4_linears(folders: tuple[str, str]) -> None:
    float_model = direct_model(folders[1], torch.bfloat16)
    assert all(layer.mlp is None for layer in float_model.model.layers.compiled.direct)  # not int4: three calls


@pytest.mark.parametrize("linear", ["auto", "torch"])
def test_bf16_equals_module_calls(folders: tuple[str, str], linear: str) -> None:
    model = direct_model(folders[1], torch.bfloat16, {"CPU_LINEAR": linear})
    direct, modules = both_ways(model)
    assert torch.equal(direct, modules)


@pytest.mark.skipif(kernel_missing("int8") is not None, reason=f"{kernel_missing('int8')}")
def test_int8_linears_equal_module_calls(folders: tuple[str, str]) -> None:
    model = direct_model(folders[1], torch.bfloat16, quantization="int8")
    direct, modules = both_ways(model)
    assert torch.equal(direct, modules)


def test_a_registered_hook_sends_the_step_through_the_modules(folders: tuple[str, str]) -> None:
    model = direct_model(folders[1], torch.bfloat16)
    seen = []
    handle = model.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    hooked = prefill_then_decode(model)
    handle.remove()
    assert len(seen) == 2  # the prefill and the decode step
    assert torch.equal(hooked, prefill_then_decode(model))
    assert len(seen) == 2  # removed: direct again


def test_switch_off_and_layers_without_a_direct_form(folders: tuple[str, str]) -> None:
    assert direct_model(folders[1], torch.bfloat16, {"CPU_DECODER": "modules"}).model.layers.compiled is None
    unfused = direct_model(folders[1], torch.bfloat16, {"CPU_FUSED_OPS": "off"})
    assert unfused.model.layers.compiled is None  # the torch norms and rotary: the modules' own paths
    with pytest.raises(ValueError, match="FOLOVLLM_CPU_DECODER='yes'"):
        direct_model(folders[1], torch.bfloat16, {"CPU_DECODER": "yes"})


def test_float32_gptq_equals_module_calls(folders: tuple[str, str]) -> None:
    model = direct_model(folders[0], torch.float32)
    direct, modules = both_ways(model)
    assert torch.equal(direct, modules)
