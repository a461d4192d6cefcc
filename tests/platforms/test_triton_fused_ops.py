"""The CUDA platform's Triton kernel forms (platforms/triton_ops/fused.py) against the torch forms they stand in
for: on CUDA when present, else through Triton's interpreter on CPU tensors (small shapes: every program runs in
numpy, one at a time). Strided q/k/v rows, padding rows (slot -1), GQA layouts, bf16 and fp32, int8/fp8 caches."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from folovllm.attention.kv_quant import KV_CACHE_FORMATS, write_quantized_kv
from folovllm.model.layers import RMSNorm, RotaryEmbedding, apply_rotary
from folovllm.model.layers.linear import WeightConfig
from tests.helpers import use_triton_interpreter_without_cuda

if importlib.util.find_spec("triton") is None:  # not importorskip: triton must not be imported yet
    pytest.skip("triton is not installed (the test extra pins it on x86-64 Linux)", allow_module_level=True)
use_triton_interpreter_without_cuda()  # before the kernels' module is imported anywhere

from folovllm.platforms.triton_ops import fused  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16_STEP = 2**-7  # one rounding step of bfloat16, relative


def assert_within_a_rounding_step(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """fp32: within 1e-5 (1e-6 relative is a few ulps); bf16: the same value or one rounding step away."""
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    if ours.dtype == torch.float32:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=BF16_STEP, atol=1e-6)


def norm_of(hidden: int, dtype: torch.dtype, gen: torch.Generator) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-6, WeightConfig(dtype, DEVICE))
    norm.weight.data = (torch.randn(hidden, generator=gen) * 0.5 + 1).to(dtype).to(DEVICE)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, hidden", [(1, 64), (5, 40), (9, 96)])
def test_add_rms_norm(dtype: torch.dtype, rows: int, hidden: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    norm = norm_of(hidden, dtype, gen)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(dtype).to(DEVICE)
    residual = torch.randn(rows, hidden, generator=gen).to(dtype).to(DEVICE)
    expected, expected_residual = norm.forward_native(x, residual.clone())
    ours_residual = residual.clone()
    out = fused.add_rms_norm(ours_residual, x, norm.weight, norm.eps)
    assert torch.equal(ours_residual, expected_residual)  # the sum rounded once, as x + residual
    # the mean of squares is summed in another order than torch's: the norm's scale may differ in its last bits
    assert_within_a_rounding_step(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_over_the_last_dim_of_any_shape(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    norm = norm_of(48, dtype, gen)
    x = torch.randn(3, 2, 48, generator=gen).to(dtype).to(DEVICE)
    out = fused.rms_norm(x, norm.weight, norm.eps)
    assert out.shape == x.shape
    assert_within_a_rounding_step(out, norm.forward_native(x))  # (the sum order, as above)


def test_the_residual_must_be_written_in_place() -> None:
    residual = torch.zeros(4, 16, device=DEVICE)[:, ::2]  # rows of 8 values that are not evenly packed
    with pytest.raises(ValueError, match="unit stride"):
        fused.add_rms_norm(residual, torch.zeros(4, 8, device=DEVICE), torch.ones(8, device=DEVICE), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, width", [(1, 1100), (7, 40)])
def test_silu_and_mul(dtype: torch.dtype, rows: int, width: int) -> None:
    gate_up = (torch.randn(rows, 2 * width, generator=torch.Generator().manual_seed(width)) * 4).to(dtype).to(DEVICE)
    out = fused.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate).mul_(up)  # GatedMLP's torch form
    # exp's last ulp may differ from torch's (numpy's exp in the interpreter; compiled, libdevice's expf)
    assert_within_a_rounding_step(out, expected)


def rotary_case(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, cache_dtype=None):
    """qkv with strided rows (a slice of a wider matmul output), a zero row, rope, slots with padding rows (-1)."""
    gen = torch.Generator().manual_seed(tokens * 31 + heads)
    width = (heads + 2 * kv_heads) * head_dim
    qkv = (torch.randn(tokens, width + 6, generator=gen) * 2).to(dtype).to(DEVICE)[:, :width]
    qkv[tokens // 2] = 0  # a row whose quantization scale is the smallest one
    positions = torch.randint(0, 500, (tokens,), generator=gen).to(DEVICE)
    rope = RotaryEmbedding(head_dim, 512, 10000.0, None, DEVICE)(positions, dtype)
    block_size, num_blocks = 4, tokens // 4 + 3
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[1::3] = -1  # padding rows own no slot
    row = head_dim + (2 if cache_dtype is not None else 0)
    caches = [torch.full((num_blocks, block_size, kv_heads, row), 3, dtype=cache_dtype or dtype, device=DEVICE)
              for _ in range(2)]
    return qkv, rope, slots.to(DEVICE), caches


def torch_form(qkv, heads, kv_heads, head_dim, rope, norms=None):
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = q.reshape(-1, heads, head_dim), k.reshape(-1, kv_heads, head_dim), v.reshape(-1, kv_heads, head_dim)
    if norms is not None:
        q, k = norms[0].forward_native(q), norms[1].forward_native(k)
    return apply_rotary(q, rope), apply_rotary(k, rope), v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 4, 16), (6, 2, 16), (9, 3, 24)])
def test_rotary_store_kv_is_the_torch_forms_bits(dtype: torch.dtype, heads: int, kv_heads: int,
                                                 head_dim: int) -> None:
    tokens = 7
    qkv, rope, slots, (k_cache, v_cache) = rotary_case(tokens, heads, kv_heads, head_dim, dtype)
    before = k_cache.clone()
    q, k, v = fused.rotary_store_kv(qkv, heads, kv_heads, rope[0], rope[1], None, None, 1e-6, k_cache, v_cache,
                                    slots)
    expected_q, expected_k, expected_v = torch_form(qkv, heads, kv_heads, head_dim, rope)
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k) and torch.equal(v, expected_v)
    flat_k, flat_v = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
    real = slots >= 0
    assert torch.equal(flat_k[slots[real]], k[real]) and torch.equal(flat_v[slots[real]], v[real])
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[slots[real]] = False
    assert torch.equal(flat_k[untouched], before.view(-1, kv_heads, head_dim)[untouched])
    assert torch.equal(flat_v[untouched], before.view(-1, kv_heads, head_dim)[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_store_kv_with_qk_norm(dtype: torch.dtype) -> None:
    tokens, heads, kv_heads, head_dim = 5, 6, 2, 32
    qkv, rope, slots, (k_cache, v_cache) = rotary_case(tokens, heads, kv_heads, head_dim, dtype)
    gen = torch.Generator().manual_seed(9)
    norms = norm_of(head_dim, dtype, gen), norm_of(head_dim, dtype, gen)
    q, k, _ = fused.rotary_store_kv(qkv, heads, kv_heads, rope[0], rope[1], norms[0].weight, norms[1].weight,
                                    norms[0].eps, k_cache, v_cache, slots)
    expected_q, expected_k, _ = torch_form(qkv, heads, kv_heads, head_dim, rope, norms)
    # the norm's sum of squares runs in another order than torch's: a normed value may be one rounding step off,
    # and rotation mixes two of them, so the bound is a step of the head's largest value
    for ours, theirs in ((q, expected_q), (k, expected_k)):
        bound = (BF16_STEP if dtype == torch.bfloat16 else 1e-5) * theirs.float().abs().amax(-1, keepdim=True)
        assert ((ours.float() - theirs.float()).abs() <= bound).all()
    real = slots >= 0
    assert torch.equal(k_cache.view(-1, kv_heads, head_dim)[slots[real]], k[real])


@pytest.mark.parametrize("fmt", sorted(KV_CACHE_FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_cache_rows_are_the_reference_quantizers_bytes(fmt: str, dtype: torch.dtype) -> None:
    """Rows holding values small enough to land on fp8's subnormal codes, a zero row, padding rows."""
    tokens, heads, kv_heads, head_dim = 6, 4, 2, 16
    code = KV_CACHE_FORMATS[fmt].code_dtype
    qkv, rope, slots, (k_cache, v_cache) = rotary_case(tokens, heads, kv_heads, head_dim, dtype, code)
    qkv[0, -head_dim:] *= torch.logspace(-6, 0, head_dim, device=DEVICE).to(dtype)  # a v row across the exponents
    expected_k_cache, expected_v_cache = k_cache.clone(), v_cache.clone()
    q, k, v = fused.rotary_store_kv(qkv, heads, kv_heads, rope[0], rope[1], None, None, 1e-6, k_cache, v_cache,
                                    slots)
    expected_q, expected_k, _ = torch_form(qkv, heads, kv_heads, head_dim, rope)
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k)
    real = slots >= 0
    write_quantized_kv(k[real], v[real], expected_k_cache, expected_v_cache, slots[real], KV_CACHE_FORMATS[fmt])
    assert torch.equal(k_cache.view(torch.uint8), expected_k_cache.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), expected_v_cache.view(torch.uint8))


def test_rotary_store_kv_rejects_a_layout_it_does_not_take() -> None:
    qkv, rope, slots, (k_cache, v_cache) = rotary_case(3, 2, 1, 8, torch.float32)
    with pytest.raises(ValueError, match="qkv must be"):
        fused.rotary_store_kv(qkv[:, :-8], 2, 1, rope[0], rope[1], None, None, 1e-6, k_cache, v_cache, slots)
