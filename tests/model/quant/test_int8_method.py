"""INT8 weight-only quantization at load time (``quantization="int8"``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from folovllm.model.loader import load_model
from folovllm.model.quantization.int8 import quantize_int8_per_channel
from folovllm.model.quantization.kernels import Int8ChannelKernel
from folovllm.platforms import platform_for
from tests.model.quant.gptq_checkpoint import write_folder
from tests.model.quant.test_gptq_loading import PROMPT, tiny_llama  # noqa: F401 (fixture)
from tests.model.test_loader import prefill_logits
from tests.tiers import kernel_missing


def _is_linear(name: str) -> bool:
    return name.endswith("_proj.weight")


def _int8_rounded(weight: torch.Tensor) -> torch.Tensor:
    codes, scales = quantize_int8_per_channel(weight)
    return (codes.float() * scales[:, None]).contiguous()


def test_per_channel_codes_round_to_nearest() -> None:
    weight = torch.randn(24, 80) * torch.logspace(-3, 0, 24)[:, None]
    weight[5] = 0  # an all-zero row
    codes, scales = quantize_int8_per_channel(weight)
    assert codes.dtype == torch.int8 and codes.abs().max() <= 127
    assert scales[5] == 1 and not codes[5].any()
    err = (codes.float() * scales[:, None] - weight).abs()
    assert bool((err <= scales[:, None] / 2 + 1e-7).all())
    assert bool((codes.abs().amax(dim=1)[scales != 1] == 127).all())  # each row's largest weight uses the range

NOT_BUILT = kernel_missing("int4")


@pytest.mark.parametrize("kernel_name", ["torch", pytest.param("folovllm", marks=pytest.mark.skipif(
    NOT_BUILT is not None, reason=f"{NOT_BUILT}"))])
@pytest.mark.parametrize("in_features", [64, 40])  # 40: not a multiple of 16, torch's kernel's block
def test_int8_kernel_matches_its_reference(in_features: int, kernel_name: str) -> None:
    codes, scales = quantize_int8_per_channel(torch.randn(48, in_features))
    x = torch.randn(5, in_features)
    kernel = Int8ChannelKernel(codes, scales, None, kernel_name)
    assert kernel.ours == (kernel_name == "folovllm")
    assert kernel.reference == (kernel_name == "torch" and in_features % 16 != 0)
    expected = x @ (codes.float() * scales[:, None]).t()
    torch.testing.assert_close(kernel(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel.code_rows(torch.tensor([3, 17, 40])), codes[[3, 17, 40]], rtol=0, atol=0)
    torch.testing.assert_close(Int8ChannelKernel(codes, scales, None, "reference")(x), expected,
                               rtol=1e-5, atol=1e-5)


def test_int8_at_load(tiny_llama, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    config, state, _ = tiny_llama
    folder = write_folder(tmp_path / "dense", config, {k: v.contiguous() for k, v in state.items()}, {})
    # the same model with each linear weight replaced by what its int8 codes stand for
    rounded = {k: _int8_rounded(v) if _is_linear(k) else v.contiguous() for k, v in state.items()}
    dense = load_model(write_folder(tmp_path / "rounded", config, rounded, {}), dtype=torch.float32, device="cpu")
    int8 = load_model(folder, quantization="int8", dtype=torch.float32, device="cpu", platform=platform_for("cpu"))
    qkv = int8.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.quant_kernel, Int8ChannelKernel) and not hasattr(qkv, "weight")
    assert int8.lm_head.weight.dtype == torch.float32  # the head stays unquantized
    got = prefill_logits(int8, PROMPT)
    torch.testing.assert_close(got, prefill_logits(dense, PROMPT), rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("FOLOVLLM_QUANT_KERNEL", "reference")
    forced = load_model(folder, quantization="int8", dtype=torch.float32, device="cpu", platform=platform_for("cpu"))
    assert forced.model.layers[0].mlp.down_proj.quant_kernel.reference
    torch.testing.assert_close(prefill_logits(forced, PROMPT), got, rtol=1e-4, atol=1e-4)
    linear_bytes = sum(b.numel() * b.element_size() for b in qkv.buffers())
    assert linear_bytes == 128 * 64 + 128 * 4  # one byte per weight, one fp32 scale per output
    assert int8.weight_bytes() < dense.weight_bytes()
