"""The torch backend's batch-invariant form: each query row's keys reduced in tiles fixed by key position.

SDPA and a batched decode reduce a row's keys in an order set by the step's shape (the chunk it sits in, the
longest context it is padded to), so its output moves with the rest of the batch. Here every query row, a
decode row or one of a prompt chunk's, walks its own keys in tiles of ``KEY_TILE`` positions starting at
multiples of ``KEY_TILE`` (online softmax, fp32): scores and the values' sums are matmuls of one shape per
(row, kv head) ([group, head_dim] x [head_dim, KEY_TILE], [group, KEY_TILE] x [KEY_TILE, head_dim]), the tile's
max is exact, its sum is a matmul too ([group, KEY_TILE] x [KEY_TILE, 1]), and the rest is element-wise; batching
rows only adds matmul problems of those shapes. A tile a row sees none of is skipped for that row.
"""
from __future__ import annotations

import torch

from folovllm.attention.kv_quant import dequantize_rows, quantized_format
from folovllm.attention.metadata import AttentionMetadata

KEY_TILE = 64  # keys per online-softmax update, at positions [KEY_TILE * j, KEY_TILE * (j + 1))
ROW_CHUNK = 512  # query rows per tile update: bounds the gathered K/V (every row's update is the same)


def _row_positions(meta: AttentionMetadata, sliding_window: int | None) -> tuple[torch.Tensor, ...]:
    """(sequence, position, first visible key) of every query row of the step."""
    device = meta.seq_lens.device
    query_lens = torch.tensor(meta.query_lens, dtype=torch.int64, device=device)
    seq = torch.repeat_interleave(torch.arange(len(meta.query_lens), device=device), query_lens)
    position = (meta.seq_lens - query_lens).index_select(0, seq) + torch.arange(seq.numel(), device=device) \
        - meta.query_start_loc[:-1].index_select(0, seq)
    first = (position - sliding_window + 1).clamp(min=0) if sliding_window else torch.zeros_like(position)
    return seq, position, first


def _gather_tile(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """[n, KEY_TILE, Hkv, D] fp32 rows of the cache at ``slots`` [n, KEY_TILE] (a quantized cache dequantized)."""
    num_kv_heads = cache.shape[2]
    if quantized_format(cache) is None:
        return cache.view(-1, num_kv_heads, cache.shape[3])[slots].float()
    rows = cache.view(torch.uint8).view(-1, num_kv_heads, cache.shape[3])[slots]
    return dequantize_rows(rows.view(cache.dtype), torch.float32)


def invariant_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                        scale: float, sliding_window: int | None) -> torch.Tensor:
    """[T, H, D]: causal attention of every query row over its sequence's cached keys (this step's stored
    already), each row reduced as the module doc says."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    seq, position, first = _row_positions(meta, sliding_window)
    q = (query.float() * scale).view(num_tokens, num_kv_heads, group, head_dim)
    device = query.device
    row_max = torch.full((num_tokens, num_kv_heads, group), float("-inf"), device=device)
    row_sum = torch.zeros(num_tokens, num_kv_heads, group, device=device)
    acc = torch.zeros(num_tokens, num_kv_heads, group, head_dim, device=device)
    first_tile, last_tile = first // KEY_TILE, position // KEY_TILE
    offsets = torch.arange(KEY_TILE, device=device)
    ones = torch.ones(1, KEY_TILE, 1, device=device)
    width = meta.block_tables.shape[1]
    for tile in range(int(last_tile.max()) + 1):
        rows = torch.nonzero((first_tile <= tile) & (last_tile >= tile)).flatten()
        for part in rows.split(ROW_CHUNK):
            keys = tile * KEY_TILE + offsets  # [KEY_TILE] positions
            visible = (keys[None, :] <= position[part, None]) & (keys[None, :] >= first[part, None])
            blocks = meta.block_tables[seq[part]][:, (keys // block_size).clamp(max=width - 1)]
            slots = blocks * block_size + keys % block_size
            n = part.numel()
            # contiguous operands of one layout: a strided one may be read transposed by another GEMM path
            k = _gather_tile(k_cache, slots).permute(0, 2, 3, 1).contiguous().view(n * num_kv_heads, head_dim, KEY_TILE)
            v = _gather_tile(v_cache, slots).permute(0, 2, 1, 3).contiguous().view(n * num_kv_heads, KEY_TILE, head_dim)
            scores = torch.bmm(q[part].view(n * num_kv_heads, group, head_dim), k).view(n, num_kv_heads, group, KEY_TILE)
            scores.masked_fill_(~visible[:, None, None, :], float("-inf"))
            old_max = row_max[part]
            new_max = torch.maximum(old_max, scores.amax(-1))
            correction = torch.exp(old_max - new_max)
            probs = torch.exp(scores - new_max[..., None])
            row_max[part] = new_max
            # the tile's sums as a GEMM of the same fixed shape (on CUDA a plain sum sizes its blocks by the rows)
            tile_sums = torch.bmm(probs.view(n * num_kv_heads, group, KEY_TILE), ones.expand(n * num_kv_heads, -1, -1))
            row_sum[part] = row_sum[part] * correction + tile_sums.view(n, num_kv_heads, group)
            values = torch.bmm(probs.view(n * num_kv_heads, group, KEY_TILE), v).view(n, num_kv_heads, group, head_dim)
            acc[part] = acc[part] * correction[..., None] + values
    return (acc / row_sum[..., None]).view(num_tokens, num_heads, head_dim).to(query.dtype)
