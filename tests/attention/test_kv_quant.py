"""Attention over a quantized KV cache (int8, fp8 e4m3/e5m2 rows with a float16 scale each): the torch and
cpu backends against the fp64 reference over the original K/V (within each format's stated bound) and over
the dequantized K/V (to float rounding: the backends read exactly what was stored); the C++ quantized
store against the torch one; rows and sizes."""
from __future__ import annotations

import math

import pytest
import torch

from folovllm.attention.backend import get_attention_backend
from folovllm.attention.kv_quant import (
    KV_CACHE_FORMATS,
    cache_row_shape,
    dequantize_rows,
    kv_cache_format,
    quantize_rows,
    write_quantized_kv,
)
from folovllm.attention.torch_backend import write_kv_cache
from tests.attention.paged_reference import reference_attention
from tests.helpers import (
    BlockPool,
    make_attn_metadata,
    use_triton_interpreter_without_cuda,
)
from tests.tiers import library_missing

torch.set_num_threads(2)
NOT_BUILT = library_missing()
BACKENDS = ["torch", pytest.param("cpu", marks=pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}"))]
# max |ours - fp64 over the original K/V| on N(0, 1) K/V and queries, head_dim 64 (outputs ~0.1-1): measured
# on CASES 0.015 (int8), 0.095 (fp8_e4m3), 0.21 (fp8_e5m2); each format's half-step error, not a loose bound
BOUND = {"int8": 0.03, "fp8_e4m3": 0.12, "fp8_e5m2": 0.25}
CASES = [
    ([1, 1, 1], [5, 17, 80]),  # decode only, blocks cut at different offsets
    ([9], [9]),  # a fresh prefill: attends its own (unquantized) K/V
    ([5], [13]),  # a chunk over cached context
    ([3, 1, 12, 1], [3, 9, 40, 4]),  # mixed batch
    ([1, 20], [300, 290]),  # contexts longer than one key tile
]


def quantized_case(fmt_name: str, query_lens: list[int], seq_lens: list[int], backend: str,
                   dtype: torch.dtype = torch.float32, num_heads: int = 4, num_kv_heads: int = 2,
                   head_dim: int = 64, block_size: int = 16, sliding_window: int | None = None,
                   seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step over a quantized cache whose context was stored by the reference quantizer; returns
    (ours, fp64 over the original K/V, fp64 over what the backend reads: dequantized K/V, except a fresh
    prefill chunk's own on the torch and cpu backends, which attend it before it is quantized)."""
    fmt = KV_CACHE_FORMATS[fmt_name]
    gen = torch.Generator().manual_seed(seed)
    pool = BlockPool(num_blocks=sum(-(-s // block_size) for s in seq_lens) + 3, seed=seed)
    shape = (len(pool.free), block_size, num_kv_heads, cache_row_shape(head_dim, fmt))
    k_cache, v_cache = torch.zeros(shape, dtype=fmt.code_dtype), torch.zeros(shape, dtype=fmt.code_dtype)
    tables, contexts, readbacks = [], [], []
    for q_len, s_len in zip(query_lens, seq_lens):
        table = pool.grow([], s_len, block_size)
        k, v = (torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
        past = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(s_len - q_len)],
                            dtype=torch.long)
        write_quantized_kv(k[: s_len - q_len], v[: s_len - q_len], k_cache, v_cache, past, fmt)
        fresh = q_len == s_len and backend != "triton"
        readbacks.append((k, v) if fresh else tuple(dequantize_rows(quantize_rows(x, fmt).view(fmt.code_dtype),
                                                                    torch.float64) for x in (k, v)))
        tables.append(table)
        contexts.append((k, v))
    meta = make_attn_metadata(query_lens, seq_lens, tables, block_size)
    queries = [torch.randn(n, num_heads, head_dim, generator=gen).to(dtype) for n in query_lens]
    new_k = torch.cat([k[s - n:] for (k, _), n, s in zip(contexts, query_lens, seq_lens)])
    new_v = torch.cat([v[s - n:] for (_, v), n, s in zip(contexts, query_lens, seq_lens)])
    scale = 1 / math.sqrt(head_dim)
    if backend == "triton":
        use_triton_interpreter_without_cuda()
    ours = get_attention_backend(backend).forward(torch.cat(queries), new_k, new_v, k_cache, v_cache, meta, scale,
                                                  sliding_window)
    ref = torch.cat([reference_attention(q, k, v, scale, sliding_window) for q, (k, v) in zip(queries, contexts)])
    read = torch.cat([reference_attention(q, k, v, scale, sliding_window) for q, (k, v) in zip(queries, readbacks)])
    return ours, ref, read


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", list(KV_CACHE_FORMATS))
@pytest.mark.parametrize("query_lens,seq_lens", CASES)
def test_quantized_cache_matches_reference_within_bound(backend: str, fmt: str, query_lens: list[int],
                                                        seq_lens: list[int]) -> None:
    ours, ref, read = quantized_case(fmt, query_lens, seq_lens, backend)
    assert (ours.double() - read).abs().max() < 1e-4  # the backend reads exactly what was stored
    assert (ours.double() - ref).abs().max() < BOUND[fmt]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_bf16_queries_and_sliding_window(backend: str, fmt: str) -> None:
    ours, ref, read = quantized_case(fmt, [1, 6, 1], [40, 30, 70], backend, dtype=torch.bfloat16,
                                     num_heads=6, num_kv_heads=3, sliding_window=17)
    assert ours.dtype == torch.bfloat16
    assert (ours.double() - read).abs().max() < 0.02  # bf16 outputs
    assert (ours.double() - ref).abs().max() < BOUND[fmt] + 0.02


@pytest.mark.parametrize("fmt", list(KV_CACHE_FORMATS))
@pytest.mark.parametrize("query_lens,seq_lens", [([1, 1], [5, 80]), ([9], [9]), ([5, 1], [13, 40])])
def test_triton_dequantizes_in_the_kernel(fmt: str, query_lens: list[int], seq_lens: list[int]) -> None:
    """In Triton's interpreter on CPU (the kernel reads every key from the cache, a fresh chunk's too)."""
    pytest.importorskip("triton")
    ours, ref, read = quantized_case(fmt, query_lens, seq_lens, "triton")
    assert (ours.double() - read).abs().max() < 1e-4
    assert (ours.double() - ref).abs().max() < BOUND[fmt]


@pytest.mark.parametrize("fmt", list(KV_CACHE_FORMATS))
def test_triton_split_decode_dequantizes_in_the_kernel(fmt: str, monkeypatch) -> None:
    """Decode rows split over their context (as a GPU would split them) read the same quantized rows."""
    pytest.importorskip("triton")
    use_triton_interpreter_without_cuda()
    from folovllm.attention import triton_kernels

    monkeypatch.setattr(triton_kernels, "decode_splits", lambda *shape: 3)
    ours, ref, read = quantized_case(fmt, [1, 1], [5, 80], "triton")
    assert (ours.double() - read).abs().max() < 1e-4
    assert (ours.double() - ref).abs().max() < BOUND[fmt]


@pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")
@pytest.mark.parametrize("fmt", list(KV_CACHE_FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rotary_store_quantizes_as_the_reference(fmt: str, dtype: torch.dtype) -> None:
    """The C++ store (rotary_store_kv) writes the same codes and scales as write_quantized_kv."""
    torch.manual_seed(0)
    tokens, heads, kv_heads, dim, block_size = 5, 4, 2, 64, 4
    code_dtype = KV_CACHE_FORMATS[fmt].code_dtype
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * dim) * 3).to(dtype)
    cos, sin = torch.ones(tokens, dim, dtype=dtype), torch.zeros(tokens, dim, dtype=dtype)  # rotary = identity
    shape = (4, block_size, kv_heads, dim + 2)
    k_cache, v_cache = torch.zeros(shape, dtype=code_dtype), torch.zeros(shape, dtype=code_dtype)
    slots = torch.tensor([3, 7, 0, 12, 9])
    _, k, v = torch.ops.folovllm.rotary_store_kv(qkv, heads, kv_heads, cos, sin, None, None, 1e-6,
                                                 k_cache, v_cache, slots)
    k_ref, v_ref = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    write_kv_cache(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))


@pytest.mark.parametrize("fmt", list(KV_CACHE_FORMATS))
def test_rows_round_trip_within_half_a_step_and_zero_rows_stay_zero(fmt: str) -> None:
    spec = KV_CACHE_FORMATS[fmt]
    x = torch.randn(50, 3, 64) * torch.logspace(-3, 2, 50)[:, None, None]
    x[7] = 0
    back = dequantize_rows(quantize_rows(x, spec).view(spec.code_dtype), torch.float32)
    scale = (x.abs().amax(-1, keepdim=True) / spec.max_code).clamp(min=2**-14)
    # int8: half a code; fp8: half an ulp of the value, or of the format's subnormals times the scale
    if fmt == "int8":
        step = scale * 0.5
    else:
        relative, subnormal = {"fp8_e4m3": (2**-4, 2**-10), "fp8_e5m2": (2**-3, 2**-17)}[fmt]
        step = torch.maximum(x.abs() * relative, scale * subnormal)
    assert ((back - x).abs() <= step * 1.01 + 1e-7).all()
    assert torch.equal(back[7], torch.zeros_like(back[7]))


def test_formats_names_and_sizes() -> None:
    assert kv_cache_format("auto") is None
    assert kv_cache_format("fp8") is KV_CACHE_FORMATS["fp8_e4m3"]  # vLLM's fp8 is e4m3
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        kv_cache_format("int4")
    assert cache_row_shape(64, None) == 64 and cache_row_shape(64, KV_CACHE_FORMATS["int8"]) == 66


def test_a_backend_that_cannot_read_a_quantized_cache_is_an_error_at_start_up() -> None:
    from folovllm.attention.kv_quant import check_backend_takes
    with pytest.raises(ValueError, match="cannot read a int8 KV cache"):
        check_backend_takes(object(), "mine", KV_CACHE_FORMATS["int8"])
    check_backend_takes(object(), "mine", None)
    for name in ("torch", "cpu", "triton"):
        from folovllm.attention.backend import ATTENTION_BACKENDS
        assert ATTENTION_BACKENDS.get(name).takes_quantized_kv
