"""The CPU kernel library's causal prefill kernel against the fp64 reference and SDPA, directly and through the
cpu backend, and its switch; at every tier the host has (avx512_bf16: the bf16 dot-product form, bf16 with
head_dim 64 or 128; avx2 and avx512: the fp32-FMA form, fp32 or bf16, head_dim a multiple of 16)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import folovllm.attention.cpu_backend as cpu_backend
from folovllm import envs
from tests.attention.paged_reference import reference_attention, run_case
from tests.tiers import skip_unless_kernel

torch.set_num_threads(2)
needs_kernel = pytest.mark.usefixtures("prefill_kernel")


@pytest.fixture
def prefill_kernel(kernel_tier: str) -> None:
    skip_unless_kernel("prefill_attention")
BF16_TOL = 3e-2  # as the paged kernel's bf16 tests
FP32_TOL = 1e-4
DTYPES = [torch.bfloat16, torch.float32]


def skip_unless_takes(dtype: torch.dtype, head_dim: int) -> None:
    if not torch.ops.folovllm.prefill_attention_takes(dtype == torch.bfloat16, head_dim):
        pytest.skip(f"the prefill kernel's form at this tier does not take {dtype} with head_dim {head_dim}")


def tolerance(dtype: torch.dtype) -> float:
    return BF16_TOL if dtype == torch.bfloat16 else FP32_TOL


def strided_qkv(num_tokens: int, heads: int, kv_heads: int, head_dim: int, seed: int,
                dtype: torch.dtype = torch.bfloat16):
    """q, k, v as the fused rotary op hands them over: q and k contiguous, v a slice of the qkv rows."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q = qkv[:, :heads * head_dim].reshape(num_tokens, heads, head_dim).contiguous()
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].reshape(num_tokens, kv_heads, head_dim).contiguous()
    v = qkv[:, (heads + kv_heads) * head_dim:].view(num_tokens, kv_heads, head_dim)
    return q, k, v


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
@pytest.mark.parametrize("heads,head_dim,lens", [
    ((9, 3), 64, [1, 7, 47, 48, 49, 64, 65, 97, 130]),  # SmolLM2's shape; chunks around the 48- and 64-row tiles
    ((16, 8), 128, [100, 257]),  # Qwen3's
    ((4, 4), 64, [3, 200]),  # no GQA
    ((6, 2), 80, [5, 70]),  # a head_dim that is not a power of two (the fp32 form only)
])
def test_op_matches_fp64_reference_and_sdpa(heads: tuple[int, int], head_dim: int, lens: list[int],
                                            dtype: torch.dtype) -> None:
    skip_unless_takes(dtype, head_dim)
    num_heads, num_kv_heads = heads
    tol = tolerance(dtype)
    q, k, v = strided_qkv(sum(lens), num_heads, num_kv_heads, head_dim, seed=len(lens), dtype=dtype)
    scale = 1 / math.sqrt(head_dim)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    out = torch.full_like(q, float("nan"))
    torch.ops.folovllm.prefill_attention(out, q, k, v, starts, lens, scale)
    for start, length in zip(starts, lens):
        rows = slice(start, start + length)
        ref = reference_attention(q[rows], k[rows], v[rows], scale)
        torch.testing.assert_close(out[rows].flatten(1).double(), ref, atol=tol, rtol=tol)
        sdpa = F.scaled_dot_product_attention(q[rows].transpose(0, 1)[None], k[rows].transpose(0, 1)[None],
                                              v[rows].transpose(0, 1)[None], is_causal=True, scale=scale,
                                              enable_gqa=True)[0].transpose(0, 1)
        torch.testing.assert_close(out[rows].double(), sdpa.double(), atol=tol, rtol=tol)


@needs_kernel
def test_op_leaves_rows_outside_the_chunks_alone() -> None:
    q, k, v = strided_qkv(20, 4, 2, 64, seed=0)
    out = torch.full_like(q, 7.0)
    torch.ops.folovllm.prefill_attention(out, q, k, v, [5], [10], 0.125)
    assert (out[:5] == 7).all() and (out[15:] == 7).all() and not (out[5:15] == 7).all()


@needs_kernel
def test_op_rejects_what_it_does_not_compute() -> None:
    q, k, v = strided_qkv(8, 4, 2, 64, seed=0)
    with pytest.raises(RuntimeError, match="with head_dim 24"):  # a multiple of no tier's vector width
        torch.ops.folovllm.prefill_attention(q[..., :24].contiguous(), q[..., :24].contiguous(),
                                                 k[..., :24].contiguous(), v[..., :24].contiguous(), [0], [8], 1.0)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        torch.ops.folovllm.prefill_attention(q.half(), q.half(), k.half(), v.half(), [0], [8], 1.0)
    with pytest.raises(RuntimeError, match="k must be a BFloat16"):
        torch.ops.folovllm.prefill_attention(torch.empty_like(q), q, k.float(), v, [0], [8], 1.0)
    with pytest.raises(RuntimeError, match="lies outside"):
        torch.ops.folovllm.prefill_attention(torch.empty_like(q), q, k, v, [4], [5], 1.0)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
@pytest.mark.parametrize("sliding_window", [None, 16, 300])
def test_backend_sends_fresh_chunks_to_the_kernel(sliding_window: int | None, dtype: torch.dtype,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    skip_unless_takes(dtype, 64)
    tol = tolerance(dtype)
    # fresh chunks of 70 and 9 rows, a decode and a chunk over context; a window shorter than a chunk
    # masks inside it, so that chunk stays with SDPA
    query_lens, seq_lens = [70, 1, 9, 12], [70, 40, 9, 30]
    calls: list[list[int]] = []
    results = {}
    for switch in ("kernel", "sdpa"):
        monkeypatch.setenv("FOLOVLLM_CPU_PREFILL_ATTENTION", switch)
        monkeypatch.setattr(cpu_backend, "prefill_kernel",
                            lambda *a: calls.append(list(a[5])) or torch.ops.folovllm.prefill_attention(*a))
        ours, ref = run_case(query_lens, seq_lens, 9, 3, 64, 16, dtype, backend="cpu",
                             sliding_window=sliding_window)
        torch.testing.assert_close(ours.double(), ref, atol=tol, rtol=tol)
        results[switch] = ours
    torch.testing.assert_close(results["kernel"].double(), results["sdpa"].double(), atol=tol, rtol=tol)
    expected = {None: [[70, 9]], 16: [[9]], 300: [[70, 9]]}[sliding_window]
    assert calls == expected  # once with the kernel on, never with it off


def test_prefill_attention_switch_rejects_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOLOVLLM_CPU_PREFILL_ATTENTION", "flash")
    with pytest.raises(ValueError, match="FOLOVLLM_CPU_PREFILL_ATTENTION='flash'; choose one of kernel, sdpa"):
        envs.value("FOLOVLLM_CPU_PREFILL_ATTENTION")


@needs_kernel
def test_prefill_attention_switch_off_leaves_the_kernel_unused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOLOVLLM_CPU_PREFILL_ATTENTION", "sdpa")
    assert not cpu_backend.CpuAttentionBackend()._prefill_kernel
    monkeypatch.setenv("FOLOVLLM_CPU_PREFILL_ATTENTION", "kernel")
    assert cpu_backend.CpuAttentionBackend()._prefill_kernel
