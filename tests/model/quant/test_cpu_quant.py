"""Our CPU W4A16 and W8A16 kernels (csrc/cpu/quant_gemm.cpp) against dequantize-then-matmul: shapes, groups,
rows, dtypes."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.model.quantization.cpu_int4 import (
    CpuInt4Kernel,
    cpu_int4_fits,
    pack_int4,
    pack_int8,
    packed_int8_rows,
)
from folovllm.model.quantization.kernels import Int8ChannelKernel
from folovllm.platforms import kernel_library
from tests.tiers import kernel_missing

NOT_BUILT = kernel_missing("int4")
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")


def _weights(n: int, k: int, group: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    return codes, torch.rand(n, groups, generator=gen) * 0.02 + 1e-3, torch.randn(n, groups, generator=gen) * 0.02


def _reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
               group: int) -> torch.Tensor:
    """x W^T in fp64 with w = (q - 8) scale + zero, the scale and zero rounded to x's dtype as the kernel holds them."""
    k = codes.shape[1]
    s = scales.to(x.dtype).double().repeat_interleave(group, 1)[:, :k]
    z = zeros.to(x.dtype).double().repeat_interleave(group, 1)[:, :k]
    return x.double() @ ((codes.double() - 8) * s + z).t()


def _check(n: int, k: int, group: int, m: int, dtype: torch.dtype, seed: int) -> None:
    codes, scales, zeros = _weights(n, k, group, seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    got = CpuInt4Kernel([codes], [scales], [zeros], group, dtype, None)(x)
    assert got.dtype == dtype and got.shape == (m, n)
    expected = _reference(x, codes, scales, zeros, group)
    # fp32: exact products, fp32 sums; bf16: the output's own rounding (2^-8 relative) dominates
    rel = 1e-5 if dtype == torch.float32 else 8e-3
    err = (got.double() - expected).abs().max().item()
    assert err <= rel * expected.abs().max().item(), err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 3, 8, 17, 64, 130])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_matches_reference(group: int, m: int, dtype: torch.dtype) -> None:
    _check(48, 384, group, m, dtype, seed=group + m)  # 3 column blocks: a pair and a single one


@settings(max_examples=30, deadline=None)
@given(out_blocks=st.integers(1, 7), in_chunks=st.integers(1, 40), group_chunks=st.sampled_from([1, 2, 4, 8, 16]),
       m=st.integers(1, 20), dtype=st.sampled_from([torch.bfloat16, torch.float32]), seed=st.integers(0, 2**16))
def test_random_shapes(out_blocks: int, in_chunks: int, group_chunks: int, m: int, dtype: torch.dtype,
                       seed: int) -> None:
    """Any output multiple of 16, input multiple of 8, group multiple of 8 (the last group may be partial)."""
    _check(16 * out_blocks, 8 * in_chunks, 8 * group_chunks, m, dtype, seed)


def test_leading_dims_and_empty_input() -> None:
    codes, scales, zeros = _weights(32, 64, 32, 0)
    kernel = CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None)
    x = torch.randn(2, 3, 64).bfloat16()
    torch.testing.assert_close(kernel(x), kernel(x.view(6, 64)).view(2, 3, 32), rtol=0, atol=0)
    assert kernel(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 32)


def test_codes_are_exact() -> None:
    """Unit scales and zero offsets: an identity input reads every code back exactly (w = q - 8)."""
    codes = (torch.arange(32 * 64) % 16).view(32, 64).to(torch.uint8)
    kernel = CpuInt4Kernel([codes], [torch.ones(32, 2)], [torch.zeros(32, 2)], 32, torch.float32, None)
    torch.testing.assert_close(kernel(torch.eye(64)), (codes.float() - 8).t(), rtol=0, atol=0)


def test_pack_layout() -> None:
    """Lane j of chunk c: column j's codes 8c + 2p at bits 4p, 8c + 2p + 1 at bits 16 + 4p."""
    codes = torch.randint(0, 16, (16, 16), dtype=torch.uint8)
    word = int(pack_int4(codes)[0, 1, 5]) & 0xFFFFFFFF
    for p in range(4):
        assert (word >> (4 * p)) & 15 == codes[5, 8 + 2 * p]
        assert (word >> (16 + 4 * p)) & 15 == codes[5, 8 + 2 * p + 1]


def test_fits_and_errors() -> None:
    assert cpu_int4_fits(576, 960, 128, torch.bfloat16)
    assert not cpu_int4_fits(576, 968, 64, torch.bfloat16)  # outputs not a multiple of 16
    assert not cpu_int4_fits(572, 960, 64, torch.bfloat16)  # inputs not a multiple of 8
    assert not cpu_int4_fits(576, 960, 64, torch.float16)
    codes, scales, zeros = _weights(32, 64, 32, 0)
    kernel = CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None)
    with pytest.raises(RuntimeError, match="does not match the packed weight's K"):
        kernel(torch.randn(1, 72).bfloat16())
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        kernel(torch.randn(1, 64).half())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 8, 17, 64, 130])  # up to 4 rows read codes directly, more a bf16 tile
@pytest.mark.parametrize("n, k", [(48, 576), (16, 2), (80, 130)])
def test_int8_matches_reference(n: int, k: int, m: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(n + k + m)
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scales = (torch.rand(n, generator=gen) * 0.01 + 1e-3).to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    got = torch.ops.folovllm.int8_gemm(x, pack_int8(codes), scales)
    assert got.dtype == dtype and got.shape == (m, n)
    expected = (x.double() @ codes.double().t()) * scales.double()
    rel = 1e-5 if dtype == torch.float32 else 8e-3
    assert (got.double() - expected).abs().max().item() <= rel * expected.abs().max().item()


@pytest.mark.parametrize("m", [1, 17, 130])
def test_claimed_tasks_give_the_bits_of_fixed_shares(m: int) -> None:
    # linear_claims on: the threads claim runs of column tasks as they go; off: a fixed share each
    codes, scales, zeros = _weights(1024, 256, 64, seed=m)
    int4 = CpuInt4Kernel([codes], [scales], [zeros], 64, torch.bfloat16, None)
    int8 = pack_int8(torch.randint(-127, 128, (1024, 256), dtype=torch.int8))
    int8_scales = torch.rand(1024).bfloat16() * 0.01 + 1e-3
    x = torch.randn(m, 256).bfloat16()
    outputs = {}
    for on in (False, True):
        with kernel_library.kernel_switches(linear_claims=on):
            outputs[on] = (int4(x), torch.ops.folovllm.int8_gemm(x, int8, int8_scales),
                           torch.ops.folovllm.int8_argmax(x, int8, int8_scales))
    for fixed, claimed in zip(outputs[False], outputs[True]):
        assert torch.equal(fixed, claimed)
    _check(1024, 256, 64, m, torch.bfloat16, seed=m)


def test_int8_packed_rows() -> None:
    codes = torch.randint(-127, 128, (64, 24), dtype=torch.int8)
    ids = torch.tensor([[0, 63], [17, 17]])
    torch.testing.assert_close(packed_int8_rows(pack_int8(codes), ids), codes[ids], rtol=0, atol=0)


def test_direct_calls_equal_forward() -> None:
    """``direct()``: one op call where that is all forward does, else forward itself (several parts)."""
    codes, scales, zeros = _weights(32, 64, 32, 0)
    kernel = CpuInt4Kernel([codes], [scales], [zeros], 32, torch.bfloat16, None)
    x = torch.randn(3, 64).bfloat16()
    assert torch.equal(kernel.direct()(x), kernel(x))
    two_parts = CpuInt4Kernel([codes, codes], [scales, scales], [zeros, zeros], 32, torch.bfloat16, None)
    assert two_parts.direct() == two_parts.forward
    int8 = Int8ChannelKernel(torch.randint(-127, 128, (32, 64), dtype=torch.int8), torch.rand(32).bfloat16(), None,
                             "folovllm")
    assert torch.equal(int8.direct()(x), int8(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 5, 64])
def test_act_order_direct_call_is_one_op_with_forwards_values(m: int, dtype: torch.dtype) -> None:
    """With a permutation of x's columns, ``direct()`` is one ``int4_gemm_perm`` call: forward's gather and
    matmul, the same values; a permutation that does not fit is refused."""
    codes, scales, zeros = _weights(32, 64, 32, 0)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(m))
    kernel = CpuInt4Kernel([codes], [scales], [zeros], 32, dtype, perm, activations="bf16")
    x = torch.randn(2, m, 64).to(dtype)
    assert kernel.direct().op_call[0] == torch.ops.folovllm.int4_gemm_perm.default
    assert torch.equal(kernel.direct()(x), kernel(x))
    with pytest.raises(RuntimeError, match="outside"):
        torch.ops.folovllm.int4_gemm_perm(x, *kernel.direct().op_call[1][:4], perm + 1)
