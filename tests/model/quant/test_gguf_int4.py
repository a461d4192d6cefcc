"""GGUF 4-bit types kept packed (load_quantized): the repack, the packed linear, a tiny GGUF model, errors."""
from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
import torch.nn.functional as F

from folovllm import LLM, SamplingParams
from folovllm.config import EngineConfig
from folovllm.model.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    RowParallelLinear,
    WeightConfig,
)
from folovllm.model.loader import default_model_path, load_model
from folovllm.model.quantization.cpu_int4 import CpuInt4Kernel
from folovllm.model.quantization.gguf_native import GGUFPackedLinearMethod
from folovllm.model.quantization.gguf_int4 import (
    GGUFInt4LinearMethod,
    dequantize_int4_parts,
    gguf_int4_parts,
)
from folovllm.platforms import kernel_library, platform_for
from tests.model.quant.gguf_files import Q, random_blocks, write_tiny_llama_gguf
from tests.model.test_loader import prefill_logits
from tests.tiers import kernel_missing
from tests.tolerance import (
    BF16_TOP2_TOLERANCE,
    TOP2_TOLERANCE,
    assert_greedy_match,
    top2_gaps,
)

INT4_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q4_K]


@pytest.mark.parametrize("qtype", INT4_TYPES, ids=lambda t: t.name)
def test_repack_is_exact(qtype: gguf.GGMLQuantizationType) -> None:
    data = random_blocks(qtype, 48, 512)
    parts = gguf_int4_parts(data, qtype, 48, 512)
    assert parts[0].dtype == torch.uint8 and int(parts[0].max()) < 16 and parts[1].shape == (48, 16)
    expected = torch.from_numpy(gguf.quants.dequantize(data, qtype))
    assert torch.equal(dequantize_int4_parts(*parts), expected)


@pytest.mark.parametrize("qtype", INT4_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layer_class", [ColumnParallelLinear, RowParallelLinear])
def test_packed_linear_matches_dequantized_linear(qtype, dtype: torch.dtype, layer_class) -> None:
    rows, cols = 96, 512
    data = random_blocks(qtype, rows, cols, seed=1)
    weight = torch.from_numpy(gguf.quants.dequantize(data, qtype))
    method = GGUFInt4LinearMethod(platform_for("cpu").linear_kernels(dtype))
    layer = layer_class(cols, rows, False, WeightConfig(dtype, torch.device("cpu"), method))
    for name, part in zip(("qcodes", "qscales", "qzeros"), gguf_int4_parts(data, qtype, rows, cols)):
        getattr(layer, name).weight_loader(getattr(layer, name), part)
    layer.method.process_weights_after_loading(layer)
    x = torch.randn(7, cols, generator=torch.Generator().manual_seed(2))
    got = layer(x.to(dtype)).float()
    if dtype == torch.float32:
        torch.testing.assert_close(got, F.linear(x, weight), atol=1e-4, rtol=1e-4)
    else:  # bf16 activations, scale and zero: the dequantized weight in bf16 is the same kind of rounding
        expected = F.linear(x.to(dtype), weight.to(dtype)).float()
        torch.testing.assert_close(got, expected, atol=0.05 * float(expected.abs().max()), rtol=0.02)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    # layer 0: q/k/v Q4_1, o Q4_0, gate/up Q4_K, down Q8_0 (stays dequantized);
    # layer 1: v in Q8_0, so the merged q/k/v is dequantized while the others are packed
    write_tiny_llama_gguf(path, [{"attn_output": Q.Q4_0, "ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q8_0},
                                 {"attn_v": Q.Q8_0}])
    return str(path)


def _packed_layers(model: torch.nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if isinstance(getattr(m, "method", None), GGUFInt4LinearMethod)}


def test_tiny_gguf_packed_matches_dequantized(tiny_gguf: str) -> None:
    packed = load_model(tiny_gguf, dtype=torch.float32, device="cpu", load_quantized=True)
    dense = load_model(tiny_gguf, dtype=torch.float32, device="cpu")
    assert _packed_layers(packed) == {"model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                                      "model.layers.0.mlp.gate_up_proj", "model.layers.1.self_attn.o_proj",
                                      "model.layers.1.mlp.gate_up_proj", "model.layers.1.mlp.down_proj"}
    assert not _packed_layers(dense)
    assert packed.weight_bytes() < dense.weight_bytes()
    ids = [5, 17, 3, 99, 42, 7, 250, 11, 64, 1, 300, 2]
    # the q/k rows of packed layers are un-permuted like the dequantized ones, or the logits would differ
    torch.testing.assert_close(prefill_logits(packed, ids), prefill_logits(dense, ids), atol=2e-4, rtol=1e-4)


@pytest.mark.skipif(kernel_missing("int4") is not None, reason=f"{kernel_missing('int4')}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_gguf_packed_our_kernel_matches_torchs(tiny_gguf: str, dtype: torch.dtype, monkeypatch) -> None:
    """FOLOVLLM_QUANT_KERNEL switches the packed layers between our GGUF kernel (every type in its own
    layout: test_gguf_packed_model.py) and torch's int4 kernel (the 4-bit types repacked): same logits."""
    models = {}
    for kernel in ("folovllm", "torch"):
        monkeypatch.setenv("FOLOVLLM_QUANT_KERNEL", kernel)
        models[kernel] = load_model(tiny_gguf, dtype=dtype, device="cpu", load_quantized=True,
                                    platform=platform_for("cpu"))
    o_proj = "model.layers.0.self_attn.o_proj"
    assert isinstance(models["folovllm"].get_submodule(o_proj).method, GGUFPackedLinearMethod)
    assert isinstance(models["torch"].get_submodule(o_proj).method, GGUFInt4LinearMethod)
    assert not isinstance(models["torch"].get_submodule(o_proj).quant_kernel, CpuInt4Kernel)
    ids = [5, 17, 3, 99, 42, 7]
    ours, torchs = (prefill_logits(models[k], ids, dtype) for k in ("folovllm", "torch"))
    tol = 2e-4 if dtype == torch.float32 else 0.02 * float(torchs.abs().max())
    torch.testing.assert_close(ours, torchs, atol=tol, rtol=0)


def test_tiny_gguf_packed_bf16_close(tiny_gguf: str) -> None:
    packed = load_model(tiny_gguf, dtype=torch.bfloat16, device="cpu", load_quantized=True,
                        platform=platform_for("cpu"))
    dense = load_model(tiny_gguf, dtype=torch.float32, device="cpu")
    ids = [5, 17, 3, 99, 42, 7]
    got, expected = prefill_logits(packed, ids, torch.bfloat16), prefill_logits(dense, ids)
    torch.testing.assert_close(got, expected, atol=0.05 * float(expected.abs().max()), rtol=0.05)


def test_load_quantized_errors(tiny_gguf: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a .gguf file"):
        load_model(str(tmp_path), dtype=torch.float32, device="cpu", load_quantized=True)
    with pytest.raises(ValueError, match="dummy weights"):
        load_model(tiny_gguf, load_format="dummy", dtype=torch.float32, device="cpu", load_quantized=True)
    with pytest.raises(ValueError, match="use one or the other"):
        load_model(tiny_gguf, quantization="int8", dtype=torch.float32, device="cpu", load_quantized=True)
    with pytest.raises(ValueError, match="which the cuda platform lacks"):
        load_model(tiny_gguf, dtype=torch.float32, device="cuda", load_quantized=True)
    with pytest.raises(ValueError, match="load_quantized must be one of auto, on, off"):
        EngineConfig(load_quantized="yes")
    with pytest.raises(ValueError, match="Q8_0 has no 4-bit repack"):
        gguf_int4_parts(random_blocks(Q.Q8_0, 16, 64), Q.Q8_0, 16, 64)


@pytest.mark.skipif(kernel_missing("gguf") is not None, reason=f"{kernel_missing('gguf')}")
def test_load_quantized_auto_keeps_a_gguf_file_in_its_types(tiny_gguf: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: on for a GGUF file's own weights (the default model is one) where our GGUF kernel runs, else off."""
    def resolved(**kwargs) -> str:
        return EngineConfig(device="cpu", **kwargs).resolve().load_quantized

    assert resolved() == "on" and resolved(model=tiny_gguf) == "on"
    assert resolved(model=str(tmp_path)) == "off"  # an HF folder
    assert resolved(model=tiny_gguf, load_format="dummy") == "off"
    assert resolved(model=tiny_gguf, quantization="int8") == "off"  # int8 asked for: quantized from bf16
    assert resolved(model=tiny_gguf, load_quantized="off") == "off"
    assert resolved(model=tiny_gguf, batch_invariant=True) == "off"  # that mode takes dense weights only
    assert not platform_for("cuda").runs_gguf_types()
    with kernel_library.running_at(kernel_library.tier()):  # the library's tier back after the capped platform
        monkeypatch.setenv("FOLOVLLM_CPU_ISA", "none")  # no kernel of ours: torch's take the 4-bit types alone
        assert resolved(model=tiny_gguf) == "off"
        monkeypatch.delenv("FOLOVLLM_CPU_ISA")
    monkeypatch.setenv("FOLOVLLM_QUANT_KERNEL", "torch")
    assert resolved(model=tiny_gguf) == "off"
    assert resolved(model=tiny_gguf, load_quantized="on") == "on"


@pytest.mark.skipif(kernel_missing("gguf") is not None, reason=f"{kernel_missing('gguf')}")
def test_default_flags_run_a_gguf_file_in_its_types(tiny_gguf: str) -> None:
    """LLM(a GGUF file) with no flag: its linears packed for our GGUF kernel (off: none), and it generates."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    packed = {}
    for mode in ("auto", "off"):
        llm = LLM(tiny_gguf, tokenizer=default_model_path(), load_quantized=mode, max_model_len=128,
                  num_gpu_blocks_override=16)
        assert llm.llm_engine.config.load_quantized == ("on" if mode == "auto" else "off")
        packed[mode] = sum(isinstance(m.method, GGUFPackedLinearMethod)
                           for m in llm.llm_engine.worker.model.modules() if isinstance(m, LinearBase))
        outputs = llm.generate([{"prompt_token_ids": [5, 17, 3, 99]}], params, use_tqdm=False)
        assert len(outputs[0].outputs[0].token_ids) == 8
    assert packed["auto"] > 0 and packed["off"] == 0


def _default_model_greedy(prompts: list[list[int]], dtype: str, load_quantized: str) -> list[list[int]]:
    # the head stays in ``dtype``: this compares the packed linears alone (test_lm_head.py covers the int8 head)
    llm = LLM(dtype=dtype, load_quantized=load_quantized, quantize_lm_head="off", max_model_len=256,
              num_gpu_blocks_override=64)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


# the default model's twins of the tiny GGUF's tests above
@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", TOP2_TOLERANCE), ("bfloat16", BF16_TOP2_TOLERANCE)])
def test_default_model_greedy_packed_vs_dequantized(dtype: str, tolerance: float) -> None:
    prompts = [[1, 4093, 314, 253, 3575, 30], [504, 3458, 282, 4649, 314], [2, 11, 12, 13, 14, 15, 16]]
    packed, dense = (_default_model_greedy(prompts, dtype, mode) for mode in ("on", "off"))
    reference = load_model(default_model_path(), dtype=getattr(torch, dtype), device="cpu",
                           platform=platform_for("cpu"))
    for prompt, got, expected in zip(prompts, packed, dense):
        logits = prefill_logits(reference, prompt + expected, reference.dtype)[len(prompt) - 1:-1]
        assert_greedy_match(got, expected, top2_gaps(list(logits)), tolerance)
