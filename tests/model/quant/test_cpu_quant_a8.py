"""Our W4A8 int4 kernel (``int4_gemm_a8``: csrc/cpu/quant_int4_a8.h with AVX512_VNNI, tiered/int4_a8.cpp
without) against its own rounding done in torch, the two forms against each other, and the
``FOLOVLLM_INT4_ACTIVATIONS`` switch that picks it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.model.quantization.cpu_int4 import INT4_A8_MIN_ROWS, CpuInt4Kernel
from folovllm.platforms import kernel_library, platform_for
from tests.tiers import kernel_missing

NOT_BUILT = kernel_missing("int4_a8")
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")


def _weights(n: int, k: int, group: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    return codes, torch.rand(n, groups, generator=gen) * 0.02 + 1e-3, torch.randn(n, groups, generator=gen) * 0.02


def _expand(values: torch.Tensor, group: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    return values.to(dtype).double().repeat_interleave(group, 1)[:, :k]


def _a8_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  group: int) -> torch.Tensor:
    """The kernel's arithmetic in fp64: per row and group d = max |x| / 127 and a = round(x / d) (half to
    even, as the kernel: x times fp32 1 / d), then x W^T with x taken as d a."""
    m, k = x.shape
    xf = x.float()
    padded = torch.nn.functional.pad(xf, (0, -k % group)).view(m, -1, group)
    d = padded.abs().amax(-1) / 127  # [m, groups], fp32 as in the kernel
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    a = (padded * inv[..., None]).round().view(m, -1)[:, :k].double()
    d_k = d.double().repeat_interleave(group, 1)[:, :k]
    s, z = _expand(scales, group, k, x.dtype), _expand(zeros, group, k, x.dtype)
    return (a * d_k) @ ((codes.double() - 8) * s + z).t()


def _check(n: int, k: int, group: int, m: int, dtype: torch.dtype, seed: int) -> None:
    codes, scales, zeros = _weights(n, k, group, seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    got = CpuInt4Kernel([codes], [scales], [zeros], group, dtype, None, "int8")(x)
    assert got.dtype == dtype and got.shape == (m, n)
    expected = _a8_reference(x, codes, scales, zeros, group)
    rel = 1e-5 if dtype == torch.float32 else 8e-3  # fp32: sums in another order; bf16: the output's rounding
    err = (got.double() - expected).abs().max().item()
    assert err <= rel * expected.abs().max().item(), err


@pytest.mark.parametrize("m", [1, 5, 17])
def test_the_byte_dot_forms_agree_bit_for_bit(m: int) -> None:
    """Integer sums are exact either way, and the epilogue is the same: VNNI's form and AVX2's give the same
    bits (run where the host has both)."""
    if not (torch.ops.folovllm.host_tier() in ("avx512_bf16", "amx") and torch.cpu._is_vnni_supported()):
        pytest.skip("this CPU lacks AVX512_VNNI: only the AVX2 form runs here")
    codes, scales, zeros = _weights(48, 384, 32, seed=m)
    x = torch.randn(m, 384).bfloat16()
    kernel = CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None, "int8")
    with kernel_library.running_at("avx512_bf16"):
        vnni = kernel(x)
    with kernel_library.running_at("avx2"):
        assert torch.equal(kernel(x), vnni)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 17, 64])
@pytest.mark.parametrize("group", [32, 128])
def test_matches_its_rounding(group: int, m: int, dtype: torch.dtype) -> None:
    _check(48, 384, group, m, dtype, seed=group + m)  # 3 column blocks: a pair and a single one


@settings(max_examples=25, deadline=None)
@given(out_blocks=st.integers(1, 7), in_chunks=st.integers(1, 40), group_chunks=st.sampled_from([1, 2, 4, 16]),
       m=st.integers(1, 9), dtype=st.sampled_from([torch.bfloat16, torch.float32]), seed=st.integers(0, 2**16))
def test_random_shapes(out_blocks: int, in_chunks: int, group_chunks: int, m: int, dtype: torch.dtype,
                       seed: int) -> None:
    """Any output multiple of 16, input multiple of 8, group multiple of 8 (the last group may be partial)."""
    _check(16 * out_blocks, 8 * in_chunks, 8 * group_chunks, m, dtype, seed)


def test_close_to_bf16_activations() -> None:
    """The extra rounding is small: int8 activations land within ~1 % of the bf16-activation product."""
    codes, scales, zeros = _weights(64, 576, 128, 3)
    x = torch.randn(4, 576).bfloat16()
    exact = CpuInt4Kernel([codes], [scales], [zeros], 128, torch.float32, None, "bf16")(x.float()).double()
    a8 = CpuInt4Kernel([codes], [scales], [zeros], 128, torch.float32, None, "int8")(x.float()).double()
    assert (a8 - exact).norm() <= 0.02 * exact.norm()


def test_zero_rows_and_leading_dims() -> None:
    codes, scales, zeros = _weights(32, 64, 32, 0)
    kernel = CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None, "int8")
    x = torch.randn(2, 3, 64).bfloat16()
    x[0, 1] = 0  # a zero group scale: its products are zero, not NaN
    y = kernel(x)
    assert torch.equal(y, kernel(x.view(6, 64)).view(2, 3, 32))
    assert torch.equal(y[0, 1], torch.zeros(32, dtype=torch.bfloat16))
    assert kernel(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 32)


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    codes, scales, zeros = _weights(32, 64, 32, 0)
    x = torch.randn(3, 64).bfloat16()
    assert platform_for("cpu").linear_kernels(torch.bfloat16).int4_activations == "bf16"  # the default
    monkeypatch.setenv("FOLOVLLM_INT4_ACTIVATIONS", "int8")
    activations = platform_for("cpu").linear_kernels(torch.bfloat16).int4_activations
    from_env = CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None, activations)
    assert from_env.activations == "int8"
    assert torch.equal(from_env.direct()(x), CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None,
                                                           "int8")(x))
    monkeypatch.setenv("FOLOVLLM_INT4_ACTIVATIONS", "int4")
    with pytest.raises(ValueError, match="FOLOVLLM_INT4_ACTIVATIONS"):
        platform_for("cpu").linear_kernels(torch.bfloat16)
    with pytest.raises(ValueError, match="activations must be one of"):
        CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None, "int4")


@pytest.mark.parametrize("rows", [1, INT4_A8_MIN_ROWS - 1, INT4_A8_MIN_ROWS, 40])
def test_auto_takes_int8_from_its_row_count(rows: int) -> None:
    codes, scales, zeros = _weights(32, 64, 32, 1)
    kernels = {a: CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None, a)
               for a in ("bf16", "int8", "auto")}
    x = torch.randn(rows, 64).bfloat16()
    expected = kernels["int8" if rows >= INT4_A8_MIN_ROWS else "bf16"](x)
    assert torch.equal(kernels["auto"](x), expected)
    assert torch.equal(kernels["auto"].direct()(x), expected)
