"""Triton kernels for paged attention: a KV-cache store and one attention kernel for the ragged batch.

Importing this module imports triton. Kernels compile for CUDA, or run on CPU tensors under
Triton's interpreter when ``TRITON_INTERPRET=1`` is set before this module is first imported
(``@triton.jit`` reads the variable when it decorates).

Both launches size their grids from tensor shapes only and read lengths and block tables from device
tensors, so they never wait on the device and can be captured in a CUDA graph. A decode-only batch whose
sequences and KV heads leave the GPU idle runs triton_decode.py's split over the context instead.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from folovllm.attention.triton_decode import DecodeTickets, decode_splits, split_decode_attention
from folovllm.attention.triton_tiles import KV_FORMATS, attend_tile

# Scores use exp2; folding log2(e) into the softmax scale turns exp(x) into exp2(x * log2(e)).
_LOG2E = 1.4426950408889634
# "No window": wider than any context, small enough that position - window stays in int32.
_NO_WINDOW = 1 << 30
# tl.dot needs at least 16 rows (and 16 columns) per tile on tensor cores.
_MIN_DOT_ROWS = 16
# Triton 3.6's interpreter multiplies bf16 bit patterns in tl.dot, so it gets fp32 operands instead.
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def is_interpreted() -> bool:
    """True when the kernels were built for Triton's CPU interpreter rather than compiled."""
    return not isinstance(_paged_attention_kernel, triton.runtime.JITFunction)


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,  # key/value [T, Hkv, D], unit stride along D
    stride_cb, stride_cs, stride_ch,  # caches [num_blocks, block_size, Hkv, D], unit stride along D
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """One program per token: copy its [Hkv, D] key and value rows to its cache slot; slot < 0 skips."""
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HEAD_DIM)[None, :]
    mask = (heads < NUM_KV_HEADS) & (slot >= 0)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    cache_offset = block * stride_cb + offset * stride_cs + heads * stride_ch + dims
    key = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    tl.store(k_cache_ptr + cache_offset, key, mask=mask)
    value = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(v_cache_ptr + cache_offset, value, mask=mask)


# Triton compiles one variant per value class of each integer argument (1, a multiple of 16, other): the
# batch's sequence count and its block table's width change from step to step, and a variant compiled
# in the middle of serving stalls that step for about a second, so those two are left unspecialized.
@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    num_seqs, scale_log2, sliding_window,
    stride_qt, stride_qh, stride_ot, stride_oh,  # query/out [T, H, D], unit stride along D
    stride_cb, stride_cs, stride_ch,  # K and V caches share one layout
    stride_bt,  # block_tables row stride
    BLOCK_SIZE: tl.constexpr,  # tokens per KV-cache block
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,  # query heads per KV head, and its power of two
    BLOCK_Q: tl.constexpr,  # query tokens per tile
    BLOCK_N: tl.constexpr,  # keys per inner-loop step
    HEAD_DIM: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # operand type of tl.dot: the input dtype (fp32 in the interpreter)
    DOT_PRECISION: tl.constexpr,
    KV_FORMAT: tl.constexpr,  # 0: K/V rows in the query's dtype; else quantized rows (triton_tiles.dequantized_rows)
    KEYS_FROM_TILE_START: tl.constexpr,  # the key loop starts at a multiple of BLOCK_N (batch-invariant tiles)
):
    """Causal attention of a tile of query rows over its sequence's paged K/V (flash-style).

    Tiling: each sequence's new tokens are cut into query tiles of BLOCK_Q tokens; program
    ``(tile, kv_head)`` owns one tile and one KV head. Its BLOCK_Q * GROUP_PAD rows are every
    (token, query head) pair of that tile that reads this KV head (GQA), so K/V are loaded once per
    group. Tiles are numbered sequence after sequence; sequence i's first tile is
    ``query_start_loc[i] // BLOCK_Q + i`` (an upper bound on the tiles before it), so the grid
    ``num_tokens // BLOCK_Q + num_seqs`` covers every tile and spare programs return at once.

    The inner loop walks the sequence's keys BLOCK_N at a time, looks each key's block up in the
    block table, and keeps a running max / sum / fp32 accumulator (online softmax). Query token j of
    a sequence with ``seq_len`` keys and ``q_len`` new tokens sits at position ``seq_len - q_len + j``
    and sees keys up to that position, and from ``position - sliding_window + 1`` on (the loop starts
    at the first row's window; "no window" is a window longer than any sequence). Rows that see no
    key (padding, seq_len 0) output zeros.
    """
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)

    # Binary search: the last sequence whose first tile is <= this tile.
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first_token = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # within the sequence's new tokens
    if first_token >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # keys cached by earlier steps

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    token = first_token + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (token < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = context_len + token
    dims = tl.arange(0, HEAD_DIM)

    q_offset = (q_start + token)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_offset, mask=row_valid[:, None], other=0.0).to(DOT_DTYPE)

    m = tl.full([BLOCK_Q * GROUP_PAD], -1e30, dtype=tl.float32)  # finite: fully masked rows stay NaN-free
    l = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    kv_end = tl.minimum(seq_len, context_len + first_token + BLOCK_Q)  # keys this tile's last token sees
    block_table = block_tables_ptr + seq * stride_bt
    kv_begin = tl.maximum(context_len + first_token - sliding_window + 1, 0)  # keys the first token sees
    if KEYS_FROM_TILE_START:  # key tiles at fixed positions, wherever the query tile starts
        kv_begin = kv_begin // BLOCK_N * BLOCK_N
    for key_start in range(kv_begin, kv_end, BLOCK_N):
        m, l, acc = attend_tile(q, m, l, acc, key_start, kv_end, q_pos, block_table, k_cache_ptr, v_cache_ptr,
                                kv_head, dims, scale_log2, sliding_window, stride_cb, stride_cs, stride_ch,
                                q_ptr.dtype.element_ty, BLOCK_SIZE, BLOCK_N, HEAD_DIM, DOT_DTYPE, DOT_PRECISION,
                                KV_FORMAT)

    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    o_offset = (q_start + token)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
    tl.store(out_ptr + o_offset, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] rows to cache slot ``slot_mapping[t]``; rows with slot < 0 are skipped."""
    key, value = _unit_last_stride(key), _unit_last_stride(value)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1], NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
    )


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                    scale: float, out: torch.Tensor | None = None, sliding_window: int | None = None,
                    num_splits: int | None = None, tiles: PrefillTiles | None = None,
                    tickets: DecodeTickets | None = None, fixed_tiles: bool = False) -> torch.Tensor:
    """Causal attention of query [T, H, D] over each sequence's paged context; returns [T, H, D]. The caches
    hold rows in the query's dtype or quantized ones (attention/kv_quant.py), dequantized as they are loaded.

    Sequence i owns query rows ``query_start_loc[i]:query_start_loc[i+1]`` and has ``seq_lens[i]``
    keys in the cache (its new keys included: store them first). ``out`` (contiguous, like query)
    receives the result when given. With ``sliding_window`` a query at position p sees only keys
    p - sliding_window + 1 .. p. A decode-only batch (one token per sequence) splits each context over
    ``num_splits`` programs (None: as many as fill the GPU, ``triton_decode.decode_splits``; 1: no split),
    merged with ``tickets`` (kept by the caller across calls; None: a fresh buffer, a memset per call);
    ``tiles``: the prefill kernel's tiles (None: this device's, ``prefill_tiles``). ``fixed_tiles``
    (batch-invariant mode): no split, and every query tile has the decode step's shape, key tiles starting at
    multiples of BLOCK_N, so a row's sums are the same whether it is decoded or sits anywhere in a prompt chunk
    (a key tile past a row's position adds exact zeros to it).
    """
    query = _unit_last_stride(query)
    num_tokens, num_heads, head_dim = query.shape
    kv_format = KV_FORMATS.get(k_cache.dtype, 0)
    if kv_format:  # quantized rows are read as bytes
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    num_kv_heads = k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    out = query.new_empty(query.shape) if out is None else out
    if num_tokens == 0:
        return out
    dot_dtype = tl.float32 if is_interpreted() else _TL_DTYPES[query.dtype]
    dot_precision = "ieee" if query.dtype == torch.float32 else "tf32"
    window = _NO_WINDOW if sliding_window is None else sliding_window
    decode = num_tokens == num_seqs
    if fixed_tiles:
        num_splits = 1
    if decode and num_splits is None:
        num_splits = decode_splits(num_seqs, num_kv_heads, block_tables.shape[1] * k_cache.shape[1],
                                   _num_sms(query.device))
    if decode and num_splits > 1:
        ticket_buffer = (tickets or DecodeTickets()).get(num_seqs * num_kv_heads, query.device)
        split_decode_attention(out, query, k_cache, v_cache, block_tables, seq_lens, scale * _LOG2E, window,
                               num_splits, ticket_buffer, kv_format, dot_dtype, dot_precision)
        return out
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    # Decode (one token per sequence): the smallest tile tl.dot takes; prefill: the device's tiles.
    tiles = tiles or prefill_tiles(head_dim)
    rows = _MIN_DOT_ROWS if decode or fixed_tiles else tiles.rows
    block_q = max(1, max(rows, group_pad) // group_pad)
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
        num_seqs, scale * _LOG2E, window,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        BLOCK_SIZE=k_cache.shape[1], GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q,
        BLOCK_N=tiles.block_n, HEAD_DIM=head_dim, DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision,
        KV_FORMAT=kv_format, num_warps=4 if decode or fixed_tiles else tiles.num_warps, num_stages=tiles.num_stages,
        KEYS_FROM_TILE_START=fixed_tiles,
    )
    return out


@dataclass(frozen=True)
class PrefillTiles:
    """The prefill kernel's tiling: query rows (tokens x the GQA group's heads) and keys per step, and the
    compiled kernel's warps and software-pipeline stages."""

    rows: int
    block_n: int
    num_warps: int
    num_stages: int


def prefill_tiles(head_dim: int) -> PrefillTiles:
    """The tiles for ``head_dim``: 128-row tiles of 8 warps on a GPU (FlashAttention-2's shape for Hopper-class
    parts; gpu_bench's attention section times them against SDPA and the 64-row tiles), 64-row ones (32 past
    head_dim 128) under the interpreter, where smaller tiles run faster."""
    if is_interpreted():
        return PrefillTiles(64, 64, 4, 1) if head_dim <= 128 else PrefillTiles(32, 32, 4, 1)
    if head_dim <= 64:
        return PrefillTiles(128, 64, 4, 3)
    if head_dim <= 128:
        return PrefillTiles(128, 64, 8, 3)
    return PrefillTiles(64, 32, 8, 2)


@functools.cache
def _num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of the device the kernels are compiled for (8 under the interpreter)."""
    return 8 if is_interpreted() else torch.cuda.get_device_properties(device).multi_processor_count


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
