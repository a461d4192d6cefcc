"""TorchAttentionBackend vs a naive per-sequence reference over contiguous K/V."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.attention.backend import get_attention_backend
from tests.helpers import BlockPool, make_attn_metadata

torch.set_num_threads(2)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Lq,Hq,D] are the last Lq positions of a context k/v [S,Hkv,D]; fp64 causal attention."""
    q_len, num_heads, head_dim = q.shape
    seq_len, num_kv_heads = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
    scores = scores.masked_fill(torch.arange(seq_len)[None, :] > q_pos, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out.reshape(q_len, num_heads * head_dim)


def run_case(
    query_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill each sequence's cached context, run one step through the backend, return (ours, reference)."""
    gen = torch.Generator().manual_seed(seed)
    pool = BlockPool(num_blocks=sum(-(-s // block_size) for s in seq_lens) + 3, seed=seed)
    k_cache = torch.zeros(len(pool.free), block_size, num_kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    tables, contexts = [], []
    for q_len, s_len in zip(query_lens, seq_lens):
        table = pool.grow([], s_len, block_size)
        k = torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        for pos in range(s_len - q_len):  # earlier steps already cached these
            blk, off = table[pos // block_size], pos % block_size
            k_cache[blk, off], v_cache[blk, off] = k[pos], v[pos]
        tables.append(table)
        contexts.append((k, v))
    meta = make_attn_metadata(query_lens, seq_lens, tables, block_size)
    queries = [torch.randn(n, num_heads, head_dim, generator=gen).to(dtype) for n in query_lens]
    new_k = torch.cat([k[s - n :] for (k, _), n, s in zip(contexts, query_lens, seq_lens)])
    new_v = torch.cat([v[s - n :] for (_, v), n, s in zip(contexts, query_lens, seq_lens)])
    scale = 1 / math.sqrt(head_dim)
    ours = get_attention_backend("torch").forward(
        torch.cat(queries), new_k, new_v, k_cache, v_cache, meta, scale
    )
    ref = torch.cat([reference_attention(q, k, v, scale) for q, (k, v) in zip(queries, contexts)])
    return ours, ref


@pytest.mark.parametrize(
    "query_lens,seq_lens",
    [
        ([1], [1]),  # first decode token right after an empty cache
        ([1, 1, 1], [5, 17, 8]),  # decode only, blocks cut at different offsets
        ([7], [7]),  # plain prefill
        ([5], [13]),  # chunked prefill over cached context
        ([3, 1, 6, 1], [3, 9, 20, 4]),  # mixed batch, decodes interleaved with chunks
    ],
)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_matches_reference_fp32(query_lens: list[int], seq_lens: list[int], heads: tuple[int, int]) -> None:
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim=16, block_size=4, dtype=torch.float32)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


@given(
    seqs=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=6
    ),  # (query_len, cached tokens)
    heads=st.sampled_from([(2, 1), (4, 2), (8, 8), (9, 3)]),
    head_dim=st.sampled_from([8, 32]),
    block_size=st.sampled_from([1, 3, 4, 16]),
    seed=st.integers(0, 1000),
)
@settings(max_examples=40, deadline=None)
def test_random_batches_fp32(
    seqs: list[tuple[int, int]], heads: tuple[int, int], head_dim: int, block_size: int, seed: int
) -> None:
    query_lens = [q for q, _ in seqs]
    seq_lens = [q + c for q, c in seqs]
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim, block_size, torch.float32, seed)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


def test_bf16_loose() -> None:
    ours, ref = run_case([1, 6, 1, 1], [30, 14, 7, 65], 8, 2, 64, 16, torch.bfloat16)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.double(), ref, atol=3e-2, rtol=3e-2)


def test_writes_new_kv_into_cache_slots() -> None:
    meta = make_attn_metadata([2, 1], [2, 5], [[3], [0, 2]], block_size=4)
    k_cache = torch.zeros(4, 4, 1, 2)
    v_cache = torch.zeros_like(k_cache)
    key = torch.arange(6.0).view(3, 1, 2)
    get_attention_backend().forward(torch.randn(3, 1, 2), key, -key, k_cache, v_cache, meta, 1.0)
    torch.testing.assert_close(k_cache[3, :2], key[:2])  # sequence 0, positions 0-1 -> block 3
    torch.testing.assert_close(k_cache[2, 0], key[2])  # sequence 1, position 4 -> block 2, offset 0
    torch.testing.assert_close(v_cache[2, 0], -key[2])


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        get_attention_backend("nope")
