"""The fused CPU ops (csrc/cpu/fused_ops.cpp) against the torch sequences they replace and an fp64
reference: ragged token counts, GQA head layouts, float32 and bfloat16, at every CPU tier this host has."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from folovllm.model.layers import RMSNorm, RotaryEmbedding, apply_rotary
from folovllm.model.layers.linear import WeightConfig

torch.set_num_threads(2)
pytestmark = pytest.mark.usefixtures("kernel_tier")  # each test at every tier this host has
CPU = torch.device("cpu")
# fp64 reference tolerance: float32 to its last bits, bfloat16 to a few of its 8 mantissa bits
REF_TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
BF16_ULP = 2**-7  # one step of bfloat16's mantissa, relative


def ops():
    return torch.ops.folovllm


def plain_norm(hidden: int, dtype: torch.dtype) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-6, WeightConfig(dtype, CPU))
    norm.weight.data = torch.randn(hidden, dtype=dtype) * 0.5 + 1
    return norm


def assert_close_to_torch_path(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """fp32: within 1e-5; bf16: at most two rounding steps away (the torch path rounds the normalized row to
    bf16 and again after the weight's product, ours once, so two half-steps can add up to one more)."""
    if ours.dtype == torch.float32:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=2 * BF16_ULP, atol=1e-6)


def rms_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, hidden", [(1, 576), (5, 17), (37, 64), (300, 96)])
def test_add_rms_norm(dtype: torch.dtype, rows: int, hidden: int) -> None:
    norm = plain_norm(hidden, dtype)
    x, residual = torch.randn(rows, hidden, dtype=dtype), torch.randn(rows, hidden, dtype=dtype)
    expected, expected_residual = norm(x, residual)  # the torch path (the module is built unfused)
    fused_residual = residual.clone()
    out = ops().add_rms_norm(fused_residual, x, norm.weight, norm.eps)
    assert torch.equal(fused_residual, expected_residual)  # the sum is rounded once, as x + residual
    assert_close_to_torch_path(out, expected)
    ref = rms_reference(x.double() + residual.double(), norm.weight, norm.eps)
    torch.testing.assert_close(out.double(), ref, rtol=REF_TOL[dtype], atol=REF_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_without_residual(dtype: torch.dtype) -> None:
    norm = plain_norm(48, dtype)
    x = torch.randn(3, 7, 48, dtype=dtype)
    out = ops().rms_norm(x, norm.weight, norm.eps)
    assert out.shape == x.shape
    assert_close_to_torch_path(out, norm(x))
    torch.testing.assert_close(out.double(), rms_reference(x, norm.weight, norm.eps),
                               rtol=REF_TOL[dtype], atol=REF_TOL[dtype])


def rotary_case(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """A qkv projection output with strided rows (as from a wider matmul), positions, a paged cache."""
    width = (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(tokens, width + 5, dtype=dtype)[:, :width]
    positions = torch.randint(0, 500, (tokens,))
    rope = RotaryEmbedding(head_dim, 512, 10000.0, None, CPU)(positions, dtype)
    block_size, num_blocks = 4, tokens // 4 + 3
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    caches = [torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype) for _ in range(2)]
    return qkv, rope, slots, caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 33])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2), (9, 3)])
def test_rotary_store_kv(dtype: torch.dtype, tokens: int, heads: int, kv_heads: int) -> None:
    head_dim = 16
    qkv, rope, slots, (k_cache, v_cache) = rotary_case(tokens, heads, kv_heads, head_dim, dtype)
    q, k, v = ops().rotary_store_kv(qkv, heads, kv_heads, rope[0], rope[1], None, None, 1e-6, k_cache, v_cache,
                                    slots)
    q_in, k_in, v_in = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q_in, k_in = q_in.reshape(tokens, heads, head_dim), k_in.reshape(tokens, kv_heads, head_dim)
    # the same roundings as the torch sequence, in either dtype
    assert torch.equal(q, apply_rotary(q_in, rope)) and torch.equal(k, apply_rotary(k_in, rope))
    assert torch.equal(v, v_in.view(tokens, kv_heads, head_dim))
    flat_k, flat_v = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
    assert torch.equal(flat_k[slots], k) and torch.equal(flat_v[slots], v)
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert not flat_k[untouched].any() and not flat_v[untouched].any()
    cos, sin = (t.double() for t in rope)  # fp64 rotation of the same inputs
    x = q_in.double()
    ref = x * cos + torch.cat([x[..., head_dim // 2:], x[..., :head_dim // 2]], dim=-1) * sin
    torch.testing.assert_close(q.double(), ref, rtol=REF_TOL[dtype], atol=REF_TOL[dtype])


def assert_rotated_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Rotary after a norm: the torch path rounds the normed head to bf16 before rotating, the fused op
    does not, so each output (a*cos - b*sin) may differ by a rounding step of a or b. Where the two
    terms cancel that step is large relative to the output, so it is bounded by the head's largest
    value, not by the output's own."""
    if ours.dtype == torch.float32:
        return assert_close_to_torch_path(ours, theirs)
    ours, theirs = ours.float(), theirs.float()
    bound = BF16_ULP * theirs.abs().amax(dim=-1, keepdim=True)
    assert ((ours - theirs).abs() <= bound).all(), (ours - theirs).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_store_kv_with_qk_norm(dtype: torch.dtype) -> None:
    tokens, heads, kv_heads, head_dim = 11, 6, 2, 32
    qkv, rope, slots, (k_cache, v_cache) = rotary_case(tokens, heads, kv_heads, head_dim, dtype)
    q_norm, k_norm = plain_norm(head_dim, dtype), plain_norm(head_dim, dtype)
    q, k, _ = ops().rotary_store_kv(qkv, heads, kv_heads, rope[0], rope[1], q_norm.weight, k_norm.weight,
                                    q_norm.eps, k_cache, v_cache, slots)
    q_in, k_in, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    expected_q = apply_rotary(q_norm(q_in.reshape(tokens, heads, head_dim)), rope)
    expected_k = apply_rotary(k_norm(k_in.reshape(tokens, kv_heads, head_dim)), rope)
    assert_rotated_close(q, expected_q)
    assert_rotated_close(k, expected_k)
    assert torch.equal(k_cache.view(-1, kv_heads, head_dim)[slots], k)


def test_rotary_store_kv_rejects_a_slot_past_the_cache() -> None:
    qkv, rope, slots, (k_cache, v_cache) = rotary_case(3, 2, 1, 8, torch.float32)
    slots[1] = k_cache.shape[0] * k_cache.shape[1]
    with pytest.raises(RuntimeError, match="lies past the cache"):
        ops().rotary_store_kv(qkv, 2, 1, rope[0], rope[1], None, None, 1e-6, k_cache, v_cache, slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, width", [(1, 1536), (9, 40), (130, 128)])
def test_silu_and_mul(dtype: torch.dtype, rows: int, width: int) -> None:
    gate_up = torch.randn(rows, 2 * width, dtype=dtype) * 4
    out = ops().silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    assert_close_to_torch_path(out, F.silu(gate) * up)
    ref = F.silu(gate.double()) * up.double()
    torch.testing.assert_close(out.double(), ref, rtol=REF_TOL[dtype], atol=REF_TOL[dtype])
