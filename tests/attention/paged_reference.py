"""A ragged paged-attention step with random K/V, and a naive fp64 reference over contiguous K/V."""
from __future__ import annotations

import math

import torch

from folovllm.attention.backend import AttentionBackend, get_attention_backend
from tests.helpers import BlockPool, make_attn_metadata


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        sliding_window: int | None = None) -> torch.Tensor:
    """q [Lq,Hq,D] are the last Lq positions of a context k/v [S,Hkv,D]; fp64 causal attention
    (with ``sliding_window``: query at p sees keys p - sliding_window < k <= p, as transformers masks)."""
    q_len, num_heads, head_dim = q.shape
    seq_len, num_kv_heads = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
    key_pos = torch.arange(seq_len)[None, :]
    hidden = key_pos > q_pos
    if sliding_window is not None:
        hidden |= key_pos <= q_pos - sliding_window
    scores = scores.masked_fill(hidden, float("-inf"))
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
    backend: str | AttentionBackend = "torch",
    sliding_window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill each sequence's cached context, run one step through ``backend`` (a name or an instance),
    return (ours, reference)."""
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
    attention = get_attention_backend(backend) if isinstance(backend, str) else backend
    ours = attention.forward(
        torch.cat(queries), new_k, new_v, k_cache, v_cache, meta, scale, sliding_window
    )
    ref = torch.cat([reference_attention(q, k, v, scale, sliding_window) for q, (k, v) in zip(queries, contexts)])
    return ours, ref
