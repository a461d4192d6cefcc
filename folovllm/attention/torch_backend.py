"""Paged attention in plain PyTorch: one batched computation for all decode tokens, SDPA per prefill chunk."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from folovllm.attention.backend import check_sliding_window, register_attention_backend
from folovllm.attention.kv_quant import (
    dequantize_rows,
    quantized_format,
    write_quantized_kv,
)
from folovllm.attention.metadata import AttentionMetadata
from folovllm.attention.torch_invariant import invariant_attention
from folovllm.paging import blocks_for_tokens


@dataclass
class _DecodePlan:
    """Index work shared by every layer of one step for its decoding (query_len == 1) sequences."""

    rows: torch.Tensor | None  # batch rows of the decode tokens; None when every token decodes
    block_ids: torch.Tensor  # [B * num_blocks] flattened block tables, padded to the longest
    pad_bias: torch.Tensor  # [B * Hkv, 1, num_blocks * block_size]: 0, or -inf past its end / before its window


@dataclass
class _PrefillChunk:
    """One sequence computing query_len > 1 tokens, maybe after cached context."""

    start: int  # its rows in the batch
    end: int
    seq_len: int
    block_ids: torch.Tensor | None  # its blocks, when cached context must be read back
    mask: torch.Tensor | None  # [q_len, seq_len] offset-causal (and windowed) mask; None = plain causal


@dataclass
class _StepPlan:
    decode: _DecodePlan | None
    prefills: list[_PrefillChunk]


@register_attention_backend("torch")
class TorchAttentionBackend:
    """CPU-friendly backend (also correct, not fast, on CUDA).

    Every layer of a step is called with the same metadata object, so index work (padded block
    tables, masks) is planned once per metadata object and sliding window: build a new
    AttentionMetadata each step rather than mutating one in place. Takes a quantized cache
    (attention/kv_quant.py): rows are quantized as they are stored and dequantized as they are gathered.
    """

    takes_quantized_kv = True
    has_batch_invariant_form = True

    def __init__(self, batch_invariant: bool = False) -> None:
        """``batch_invariant``: every query row through ``torch_invariant.invariant_attention``."""
        self._batch_invariant = batch_invariant
        self._last_meta: AttentionMetadata | None = None
        self._plans: dict[int | None, _StepPlan] = {}  # by sliding window, for self._last_meta

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        kv_stored: bool = False,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        if not kv_stored:  # the fused rotary op stored them already
            write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        if self._batch_invariant:
            check_sliding_window(sliding_window)
            return invariant_attention(query, k_cache, v_cache, meta, scale, sliding_window).view(num_tokens, -1)
        plan = self._get_plan(meta, num_tokens, k_cache.shape[2], query.dtype, sliding_window)
        if plan.decode is not None and plan.decode.rows is None:
            return _decode(query, k_cache, v_cache, plan.decode, scale).view(num_tokens, -1)

        out = query.new_empty(num_tokens, num_heads, head_dim)
        if plan.decode is not None:
            rows = plan.decode.rows
            out[rows] = _decode(query[rows], k_cache, v_cache, plan.decode, scale)
        for chunk in plan.prefills:
            s, e = chunk.start, chunk.end
            out[s:e] = _prefill(query[s:e], key[s:e], value[s:e], k_cache, v_cache, chunk, scale)
        return out.view(num_tokens, num_heads * head_dim)

    def _get_plan(
        self, meta: AttentionMetadata, num_tokens: int, num_kv_heads: int, dtype: torch.dtype,
        sliding_window: int | None,
    ) -> _StepPlan:
        if self._last_meta is not meta:
            self._last_meta, self._plans = meta, {}
        if sliding_window not in self._plans:
            check_sliding_window(sliding_window)
            self._plans[sliding_window] = _make_plan(meta, num_tokens, num_kv_heads, dtype, sliding_window)
        return self._plans[sliding_window]


def _make_plan(
    meta: AttentionMetadata, num_tokens: int, num_kv_heads: int, dtype: torch.dtype,
    sliding_window: int | None,
) -> _StepPlan:
    device = meta.block_tables.device
    starts = list(itertools.accumulate(meta.query_lens, initial=0))
    decode_seqs = [i for i, n in enumerate(meta.query_lens) if n == 1]
    decode = None
    if decode_seqs:
        num_blocks = blocks_for_tokens(max(meta.seq_lens_list[i] for i in decode_seqs), meta.block_size)
        tables, seq_lens, rows = meta.block_tables[:, :num_blocks], meta.seq_lens, None
        if len(decode_seqs) != num_tokens:
            seq_idx = torch.tensor(decode_seqs, device=device)
            tables, seq_lens = tables[seq_idx], seq_lens[seq_idx]
            rows = torch.tensor([starts[i] for i in decode_seqs], device=device)
        padded_len = num_blocks * meta.block_size
        key_pos = torch.arange(padded_len, device=device)
        pad_mask = key_pos >= seq_lens[:, None]
        if sliding_window is not None:  # the decode token sits at seq_len - 1
            pad_mask |= key_pos <= seq_lens[:, None] - 1 - sliding_window
        pad_bias = torch.zeros(pad_mask.shape, dtype=dtype, device=device).masked_fill_(pad_mask, -math.inf)
        pad_bias = pad_bias.repeat_interleave(num_kv_heads, dim=0)[:, None, :]
        decode = _DecodePlan(rows, tables.reshape(-1), pad_bias)

    prefills = []
    for i, q_len in enumerate(meta.query_lens):
        if q_len == 1:
            continue
        seq_len = meta.seq_lens_list[i]
        block_ids = mask = None
        if seq_len != q_len:
            block_ids = meta.block_tables[i, : blocks_for_tokens(seq_len, meta.block_size)]
        if seq_len != q_len or (sliding_window is not None and seq_len > sliding_window):
            # query j sits at absolute position seq_len - q_len + j and sees keys up to there
            q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
            key_pos = torch.arange(seq_len, device=device)[None, :]
            mask = key_pos <= q_pos
            if sliding_window is not None:
                mask &= key_pos > q_pos - sliding_window
        prefills.append(_PrefillChunk(starts[i], starts[i + 1], seq_len, block_ids, mask))
    return _StepPlan(decode, prefills)


def _decode(
    query: torch.Tensor,  # [B, Hq, D], one token per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: _DecodePlan,
    scale: float,
) -> torch.Tensor:
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    # Padded context as [B * Hkv, L, D]. Whole-block rows stream from DRAM faster than per-head
    # rows (measured); contiguous() first is much faster than bmm on the strided view.
    keys = gather_blocks(k_cache, plan.block_ids, batch, query.dtype).transpose(1, 2).contiguous().flatten(0, 1)
    values = gather_blocks(v_cache, plan.block_ids, batch, query.dtype).transpose(1, 2).contiguous().flatten(0, 1)
    q = query.view(batch * num_kv_heads, num_heads // num_kv_heads, head_dim)  # GQA: heads grouped
    # scale and padding mask ride along in the GEMM; softmax accumulates in fp32
    scores = torch.baddbmm(plan.pad_bias, q, keys.transpose(1, 2), alpha=scale)  # [B * Hkv, G, L]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.bmm(probs, values).view(batch, num_heads, head_dim)


def _prefill(
    query: torch.Tensor,  # [Lq, Hq, D]: this chunk's queries
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: _PrefillChunk,
    scale: float,
) -> torch.Tensor:
    if chunk.block_ids is None:  # no cached context: the fresh keys are the whole context
        keys, values = key, value
    else:
        keys = gather_blocks(k_cache, chunk.block_ids, 1, query.dtype)[0, : chunk.seq_len]
        values = gather_blocks(v_cache, chunk.block_ids, 1, query.dtype)[0, : chunk.seq_len]
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1).unsqueeze(0),
        keys.transpose(0, 1).unsqueeze(0),
        values.transpose(0, 1).unsqueeze(0),
        attn_mask=chunk.mask,
        is_causal=chunk.mask is None,
        scale=scale,
        enable_gqa=query.shape[1] != keys.shape[1],
    )
    return out.squeeze(0).transpose(0, 1)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each token's K/V at its cache slot (block_id * block_size + offset), quantized for a quantized cache."""
    fmt = quantized_format(k_cache)
    if fmt is not None:
        write_quantized_kv(key, value, k_cache, v_cache, slot_mapping, fmt)
        return
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor, num_seqs: int,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """Flattened [num_seqs * nb] block ids -> [num_seqs, nb * block_size, Hkv, D] (junk past ends); a
    quantized cache's rows dequantized to ``dtype``."""
    num_blocks, _, num_kv_heads, row = cache.shape
    fmt = quantized_format(cache)
    # index_select of whole-block rows is several times faster than advanced indexing on CPU
    source = cache if fmt is None else cache.view(torch.uint8)
    rows = source.view(num_blocks, -1).index_select(0, block_ids).view(num_seqs, -1, num_kv_heads, row)
    if fmt is None:
        return rows
    return dequantize_rows(rows.view(cache.dtype), dtype or torch.float32)
