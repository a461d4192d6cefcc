"""The CPU quantized kernels against the reference dequantize-then-matmul, over shapes and GPTQ settings."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.model.quantization.cpu_int4 import CpuInt4Kernel
from folovllm.model.quantization.kernels import (
    Int4Kernel,
    Int8ChannelKernel,
    ReferenceGPTQKernel,
    dequantize_gptq,
    gptq_kernel,
)
from folovllm.platforms import LinearKernels, platform_for
from tests.model.quant.gptq_checkpoint import act_order_g_idx, rtn_gptq
from tests.tiers import kernel_missing

NOT_BUILT = kernel_missing("int4")
# the 4-bit kernels: torch's, and ours where it runs here
BACKENDS = ["torch", pytest.param("folovllm", marks=pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}"))]
INT4_CLASSES = {"torch": Int4Kernel, "folovllm": CpuInt4Kernel}


def _layer(out_features: int, in_features: int, bits: int, group_size: int, sym: bool, desc_act: bool,
           zero_offset: int, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen) * 0.05
    g_idx = act_order_g_idx(in_features, group_size, gen) if desc_act else None
    return rtn_gptq(weight, bits, group_size, sym, zero_offset, g_idx)


def _kernel(tensors: dict[str, torch.Tensor], bits: int, zero_offset: int, dtype: torch.dtype,
            kernel: str = "torch") -> torch.nn.Module:
    """The GPTQ layer's kernel for a LinearKernels.quant choice (auto: the CPU platform's)."""
    kernels = platform_for("cpu").linear_kernels(dtype) if kernel == "auto" else LinearKernels(quant=kernel)
    return gptq_kernel(tensors["qweight"], tensors["qzeros"], tensors["scales"].float(), tensors["g_idx"], bits,
                       zero_offset, dtype, kernels)


def _close(actual: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    err = (actual.float() - expected.float()).abs().max().item()
    assert err <= rel * max(expected.float().abs().max().item(), 1e-3), (err, expected.abs().max().item())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_offset", [0, 1])
def test_dequantize_matches_the_codes_written(bits: int, zero_offset: int) -> None:
    tensors, dense = _layer(32, 96, bits, 32, sym=False, desc_act=True, zero_offset=zero_offset, seed=0)
    got = dequantize_gptq(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], bits,
                          zero_offset)
    torch.testing.assert_close(got.t(), dense, rtol=0, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    bits=st.sampled_from([4, 8]),
    group_size=st.sampled_from([32, 64, 128, -1]),
    sym=st.booleans(),
    desc_act=st.booleans(),
    zero_offset=st.sampled_from([0, 1]),
    out_blocks=st.integers(1, 4),
    in_blocks=st.integers(1, 9),
    tokens=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    kernel_name=st.sampled_from(["torch"] if NOT_BUILT else ["torch", "folovllm"]),
)
def test_kernel_matches_reference_fp32(bits: int, group_size: int, sym: bool, desc_act: bool, zero_offset: int,
                                       out_blocks: int, in_blocks: int, tokens: int, seed: int,
                                       kernel_name: str) -> None:
    out_features, in_features = 16 * out_blocks, 32 * in_blocks  # e.g. 288 rows in groups of 128: a partial group
    tensors, dense = _layer(out_features, in_features, bits, group_size, sym, desc_act, zero_offset, seed)
    x = torch.randn(tokens, in_features, generator=torch.Generator().manual_seed(seed))
    kernel = _kernel(tensors, bits, zero_offset, torch.float32, kernel_name)
    assert not isinstance(kernel, ReferenceGPTQKernel)  # every one of these shapes has a CPU kernel
    expected = x @ dense.t()
    _close(_kernel(tensors, bits, zero_offset, torch.float32, "reference")(x), expected, 1e-5)
    _close(kernel(x), expected, 1e-4)


@pytest.mark.parametrize("kernel_name", BACKENDS)
@pytest.mark.parametrize("bits, group_size, desc_act", [(4, 128, False), (4, 32, True), (8, -1, False),
                                                        (8, 64, True)])
def test_kernel_matches_reference_bf16(bits: int, group_size: int, desc_act: bool, kernel_name: str) -> None:
    tensors, dense = _layer(64, 256, bits, group_size, sym=False, desc_act=desc_act, zero_offset=1, seed=3)
    x = torch.randn(7, 256)
    out = _kernel(tensors, bits, 1, torch.bfloat16, kernel_name)(x.bfloat16())
    assert out.dtype == torch.bfloat16
    _close(out, x @ dense.t(), 3e-2)


@pytest.mark.parametrize("kernel_name", BACKENDS)
def test_kernel_choice_per_format(kernel_name: str) -> None:
    int4_class = INT4_CLASSES[kernel_name]
    four, _ = _layer(32, 128, 4, 64, sym=True, desc_act=False, zero_offset=1, seed=0)
    assert isinstance(_kernel(four, 4, 1, torch.float32, kernel_name), int4_class)
    act, _ = _layer(32, 128, 4, 64, sym=True, desc_act=True, zero_offset=1, seed=0)
    act_kernel = _kernel(act, 4, 1, torch.float32, kernel_name)
    assert isinstance(act_kernel, int4_class) and act_kernel.perm is not None
    channel, _ = _layer(32, 128, 8, -1, sym=True, desc_act=False, zero_offset=1, seed=0)
    channel_kernel = _kernel(channel, 8, 1, torch.float32, kernel_name)
    assert isinstance(channel_kernel, Int8ChannelKernel) and channel_kernel.offsets is None  # symmetric
    grouped, _ = _layer(32, 128, 8, 32, sym=False, desc_act=False, zero_offset=1, seed=0)
    grouped_kernel = _kernel(grouped, 8, 1, torch.float32, kernel_name)
    assert isinstance(grouped_kernel, int4_class) and grouped_kernel.num_parts == 2  # high and low nibbles
    assert isinstance(_kernel(four, 4, 1, torch.float32, "reference"), ReferenceGPTQKernel)


@pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")
def test_auto_picks_ours_and_tiles_partial_groups() -> None:
    """auto runs ours where it is built; 288 rows in GPTQ groups of 128 run as groups of 128 (torch: 32)."""
    tensors, _ = _layer(32, 288, 4, 128, sym=True, desc_act=False, zero_offset=1, seed=0)
    ours = _kernel(tensors, 4, 1, torch.bfloat16, "auto")
    assert isinstance(ours, CpuInt4Kernel) and ours.group_size == 128
    assert _kernel(tensors, 4, 1, torch.bfloat16, "torch").group_size == 32


def test_shapes_no_kernel_takes_fall_back_to_reference() -> None:
    tensors, dense = _layer(8, 64, 4, 32, sym=True, desc_act=False, zero_offset=1, seed=0)  # 8 outputs: not 16k
    kernel = _kernel(tensors, 4, 1, torch.float32)
    assert isinstance(kernel, ReferenceGPTQKernel)
    x = torch.randn(2, 64)
    _close(kernel(x), x @ dense.t(), 1e-5)


@pytest.mark.parametrize("kernel_name", BACKENDS)
def test_int4_zero_point_convention(kernel_name: str) -> None:
    """One group, known codes: the kernel computes (q - z) * s exactly, for z across its range."""
    in_features, out_features = 32, 16
    codes = torch.arange(in_features * out_features).reshape(in_features, out_features) % 16
    zeros = torch.arange(out_features)[None, :]  # z = 0 .. 15, one per output
    scales = torch.full((1, out_features), 0.5)
    from folovllm.model.quantization.pack import pack_int32

    qweight, qzeros = pack_int32(codes.int(), 4, 0), pack_int32(zeros.int(), 4, 1)
    g_idx = torch.zeros(in_features, dtype=torch.int32)
    kernel = gptq_kernel(qweight, qzeros, scales, g_idx, 4, 0, torch.float32, LinearKernels(quant=kernel_name))
    assert isinstance(kernel, INT4_CLASSES[kernel_name])
    weight = (codes - zeros).float() * 0.5  # [in, out]
    x = torch.eye(in_features)
    torch.testing.assert_close(kernel(x), weight, rtol=0, atol=1e-6)
