"""Decode attention split over the context (flash-decoding) in one launch: each (sequence, KV head) pair's keys
are cut into ``num_splits`` ranges, one program per range keeps its own running max, sum and unnormalized
output, and the last program of the pair to finish (a ticket taken with an atomic add) merges the ranges. One
sequence at a 4k context then runs on as many programs as it has ranges times KV heads, not on one program per
KV head, and a decode step still launches one attention kernel per layer.

Used by attention/triton_kernels.py's ``paged_attention`` for decode-only batches (one token per sequence, as a
decode CUDA graph's), where the sequences and KV heads alone leave most of the GPU idle. The number of ranges
and their length come from shapes only (the batch, the block table's width): a graph captured at a batch size
replays with the same split, and no length is read on the host. The tickets live in a buffer of zeros the
caller keeps (``DecodeTickets``); the merging program puts its pair's back to zero.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from folovllm.attention.triton_tiles import attend_tile

MAX_SPLITS = 32  # ranges per sequence at most
MIN_SPLIT_KEYS = 256  # a range shorter than this costs more to merge than it saves


@triton.jit(do_not_specialize=["keys_per_split", "num_splits", "stride_bt"])
def _decode_split_kernel(
    out_ptr, acc_ptr, ml_ptr, tickets_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    scale_log2, sliding_window, keys_per_split, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, KV_FORMAT: tl.constexpr,
):
    """Program (sequence, KV head, range): the sequence's one query token, for the GROUP query heads that read
    this KV head (ROWS >= 16 rows for tl.dot, the spare ones masked), over keys [range start, range end) that it
    sees (its window's last keys); writes the range's unnormalized output, running max and sum, then takes a
    ticket: the pair's last program merges every range's (weights exp2(range max - overall max)) into ``out``.
    A row that saw no key at all (padding, seq_len 0) gets zeros."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * keys_per_split
    kv_begin = tl.maximum(start, seq_len - sliding_window)  # the query sits at seq_len - 1
    kv_end = tl.minimum(start + keys_per_split, seq_len)
    rows = tl.arange(0, ROWS)
    head = kv_head * GROUP + rows
    row_valid = rows < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qt + head[:, None] * stride_qh + dims[None, :], mask=row_valid[:, None],
                other=0.0).to(DOT_DTYPE)
    m = tl.full([ROWS], -1e30, dtype=tl.float32)
    l = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    q_pos = seq_len - 1 + tl.zeros([ROWS], dtype=tl.int64)  # each row is the sequence's last token
    for key_start in range(kv_begin, kv_end, BLOCK_N):
        m, l, acc = attend_tile(q, m, l, acc, key_start, kv_end, q_pos, block_table, k_cache_ptr, v_cache_ptr,
                                kv_head, dims, scale_log2, sliding_window, stride_cb, stride_cs, stride_ch,
                                q_ptr.dtype.element_ty, BLOCK_SIZE, BLOCK_N, HEAD_DIM, DOT_DTYPE, DOT_PRECISION,
                                KV_FORMAT)
    part = (seq * NUM_HEADS + head).to(tl.int64) * num_splits  # this pair's rows' first range
    tl.store(acc_ptr + (part + split)[:, None] * HEAD_DIM + dims[None, :], acc, mask=row_valid[:, None])
    tl.store(ml_ptr + 2 * (part + split), m, mask=row_valid)
    tl.store(ml_ptr + 2 * (part + split) + 1, l, mask=row_valid)
    ticket_ptr = tickets_ptr + seq * NUM_KV_HEADS + kv_head
    if tl.atomic_add(ticket_ptr, 1) == num_splits - 1:  # acq_rel: every range's stores are seen from here on
        top = tl.full([ROWS], -1e30, dtype=tl.float32)
        for s in range(num_splits):
            top = tl.maximum(top, tl.load(ml_ptr + 2 * (part + s), mask=row_valid, other=-1e30, cache_modifier=".cg"))
        total = tl.zeros([ROWS], dtype=tl.float32)
        merged = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
        for s in range(num_splits):
            weight = tl.exp2(tl.load(ml_ptr + 2 * (part + s), mask=row_valid, other=-1e30, cache_modifier=".cg")
                             - top)
            total += weight * tl.load(ml_ptr + 2 * (part + s) + 1, mask=row_valid, other=0.0, cache_modifier=".cg")
            merged += weight[:, None] * tl.load(acc_ptr + (part + s)[:, None] * HEAD_DIM + dims[None, :],
                                                mask=row_valid[:, None], other=0.0, cache_modifier=".cg")
        out = merged / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + seq * stride_ot + head[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
        tl.atomic_xchg(ticket_ptr, 0)  # zero again for the next launch


class DecodeTickets:
    """The tickets' buffer of zeros (one int32 per sequence and KV head), kept by its caller and grown as batches
    grow, so a launch (a graph's replay too) finds it zeroed without a memset of its own."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def get(self, count: int, device: torch.device) -> torch.Tensor:
        if self._buffer is None or self._buffer.numel() < count or self._buffer.device != device:
            self._buffer = torch.zeros(max(count, 256), dtype=torch.int32, device=device)
        return self._buffer


def decode_splits(num_seqs: int, num_kv_heads: int, max_keys: int, num_sms: int) -> int:
    """How many ranges to cut each sequence's keys into: enough programs for two per SM, each range at least
    ``MIN_SPLIT_KEYS`` of the ``max_keys`` the block table can hold, at most ``MAX_SPLITS``; 1: no split."""
    wanted = triton.cdiv(2 * num_sms, max(1, num_seqs * num_kv_heads))
    return max(1, min(wanted, MAX_SPLITS, triton.cdiv(max_keys, MIN_SPLIT_KEYS)))


def split_decode_attention(out: torch.Tensor, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale_log2: float, sliding_window: int,
                           num_splits: int, tickets: torch.Tensor, kv_format: int, dot_dtype: tl.dtype,
                           dot_precision: str) -> None:
    """Decode attention of query [S, H, D] (one token per sequence) over ``num_splits`` ranges of each sequence's
    keys, written into ``out`` [S, H, D]; the caches as ``paged_attention`` takes them; ``tickets``: zeros, at
    least S x Hkv of them (``DecodeTickets``), left zero."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    max_keys = block_tables.shape[1] * block_size
    block_n = 64 if head_dim <= 128 else 32
    keys_per_split = triton.cdiv(triton.cdiv(max_keys, num_splits), block_n) * block_n
    acc = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
    ml = torch.empty(num_seqs, num_heads, num_splits, 2, dtype=torch.float32, device=query.device)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        out, acc, ml, tickets, query, k_cache, v_cache, block_tables, seq_lens, scale_log2, sliding_window,
        keys_per_split, num_splits, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads, BLOCK_SIZE=block_size, GROUP=group, ROWS=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, HEAD_DIM=head_dim, DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, KV_FORMAT=kv_format)
