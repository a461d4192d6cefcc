"""Paged attention with a C++ kernel for CPU that reads K/V in place through the block table.

The kernel (``torch.ops.folovllm.paged_attention``, csrc/cpu/attention.cpp) runs decode rows and prefill
chunks over cached context in a single call per layer, flash-style over key tiles with fp32 accumulation;
the torch backend instead gathers every sequence's blocks into contiguous tensors each step. A prefill chunk
with no cached context has its K/V contiguous already: it goes to SDPA, whose GEMM tiles beat the kernel
there. A chunk of ``SDPA_MIN_ROWS`` or more new tokens over cached context (a prefix-cache hit, a later
chunk of a long prompt) goes to SDPA too: its blocks are gathered once and a causal mask offset by the
context is applied, about twice as fast as the kernel's per-tile loop there.

Fresh chunks with no sliding window cutting into them go to the library's own causal prefill kernel
instead (csrc/cpu/attention_prefill.h): all of a step's in one call, written into the output in place. At
the avx512_bf16 tier it takes bfloat16 (head_dim 64 or 128; about 5x faster than SDPA's CPU flash kernel
there), at the avx2 and avx512 tiers float32 and bfloat16 in fp32 FMAs (head_dim a multiple of 16);
``prefill_attention_takes`` says which. ``FOLOVLLM_CPU_PREFILL_ATTENTION=sdpa`` sends them to SDPA.

Decode rows prefetch the K/V rows of the tile they read next (their own next tile, or the next sequence's
first) while a tile computes, so a batch's scattered cache blocks stream from memory instead of stalling
each load (2.2-2.6x faster decode attention at batch 128 over contexts 40-256 on one thread); the kernel's
threads take their work items in runs that shrink as items run out, not one at a time (at batch 128,
claiming each sub-microsecond item moved the shared counter between the two cores about as often as it
computed). Both change only when loads and claims happen: the outputs are the same bits either way. They
and the decode forms are the kernel's switches, set for the process from ``FOLOVLLM_CPU_ATTENTION_*``
(``kernel_library.kernel_switches`` in tests), not arguments of a call.

Batch-invariant mode (``batch_invariant=True``): every query row goes through the kernel as a decode row
(its own sequence of one new token at its position), so a row's keys are reduced by one form, in tiles set
by its position alone, whether it is decoded, in a prompt chunk cut anywhere, recomputed after preemption,
after a prefix-cache hit or a speculative verification row. No chunk goes to SDPA or the prefill kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from folovllm import envs
from folovllm.attention.backend import check_sliding_window, register_attention_backend
from folovllm.attention.kv_quant import dequantize_rows, quantized_format
from folovllm.attention.metadata import AttentionMetadata
from folovllm.attention.torch_backend import write_kv_cache
from folovllm.platforms import kernel_library

SDPA_MIN_ROWS = 8  # new tokens over cached context from which SDPA is not slower than the kernel


@register_attention_backend("cpu")
class CpuAttentionBackend:
    """CPU only; float32 or bfloat16, any block size, num_heads a multiple of num_kv_heads.

    Every layer of a step is called with the same metadata object, so the step's fresh prefill chunks
    (and their sliding-window masks) are built once per metadata object (as in the torch backend: build
    a new one each step). Takes a quantized cache (attention/kv_quant.py): the kernel dequantizes rows as it
    reads them; chunks left to SDPA gather and dequantize their cached context.
    """

    takes_quantized_kv = True
    has_batch_invariant_form = True

    def __init__(self, sdpa_from: int = SDPA_MIN_ROWS, batch_invariant: bool = False) -> None:
        """``sdpa_from``: chunks of this many new tokens over cached context go to SDPA (0: the kernel takes
        every one); ``batch_invariant``: every query row as a decode row (the module doc)."""
        if not kernel_library.has_kernel("paged_attention"):
            raise RuntimeError("attention_backend 'cpu' is unavailable: "
                               f"{kernel_library.load() or 'the CPU tier is below avx2'} "
                               "(or choose attention_backend 'torch')")
        self._op = torch.ops.folovllm.paged_attention
        self.sdpa_from = sdpa_from
        self._prefill_kernel = (envs.value("FOLOVLLM_CPU_PREFILL_ATTENTION") == "kernel"
                                and kernel_library.has_kernel("prefill_attention"))
        self._prefill_takes: dict[tuple[torch.dtype, int], bool] = {}  # (dtype, head_dim) -> the kernel's answer
        self._batch_invariant = batch_invariant
        self._last_rows: tuple[AttentionMetadata, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self._last_chunks: tuple[AttentionMetadata, list[tuple[int, int, int]]] | None = None
        # (length, context, window) -> mask, and window -> the prefill kernel's share, for that metadata
        self._masks: dict[tuple[int, int, int], torch.Tensor] = {}
        self._splits: dict[int, tuple[list[int], list[int], list[tuple[int, int, int, int]]]] = {}

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
        check_sliding_window(sliding_window)
        if not kv_stored:  # the fused rotary op stored them already
            write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        query = query.contiguous()  # q is often a slice of a fused qkv projection
        out = torch.empty_like(query)
        tables, seq_lens, starts = self.kernel_metadata(meta)
        self._op(out, query, k_cache, v_cache, tables, seq_lens, starts, scale=scale,
                 sliding_window=sliding_window or 0, skip_prefills_from=self.sdpa_from)
        if self._batch_invariant:  # the kernel took every row
            return out.view(num_tokens, num_heads * head_dim)
        gqa = num_heads != key.shape[1]
        chunks = self._sdpa_chunks(meta)
        if chunks and self._prefill_kernel and self._kernel_takes(query.dtype, head_dim):
            starts, lens, chunks = self._fresh_split(chunks, sliding_window)
            if starts:
                prefill_kernel(out, query, heads_contiguous(key), heads_contiguous(value), starts, lens, scale)
        for seq, start, end, context in chunks:
            if context == 0:
                k, v = key[start:end], value[start:end]
            else:  # the chunk's own K/V are in the cache already: gather the whole sequence once
                k, v = (gather_sequence(cache, meta.block_tables[seq], context + end - start, query.dtype)
                        for cache in (k_cache, v_cache))
            mask = self._mask(end - start, context, sliding_window, query.device)
            # 4-D [1, H, L, D]: SDPA takes its fused CPU kernel only for batched inputs
            out[start:end] = F.scaled_dot_product_attention(
                query[start:end].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=gqa)[0].transpose(0, 1)
        return out.view(num_tokens, num_heads * head_dim)

    def _kernel_takes(self, dtype: torch.dtype, head_dim: int) -> bool:
        if (dtype, head_dim) not in self._prefill_takes:
            self._prefill_takes[dtype, head_dim] = (dtype in (torch.float32, torch.bfloat16) and bool(
                torch.ops.folovllm.prefill_attention_takes(dtype == torch.bfloat16, head_dim)))
        return self._prefill_takes[dtype, head_dim]

    def kernel_takes_whole_step(self, meta: AttentionMetadata) -> bool:
        """Whether ``forward`` on this step (K/V stored already) is the kernel op alone: no prefill chunk
        goes to SDPA or the prefill kernel (true of every decode-only step, and of every step when batch-invariant)."""
        return self._batch_invariant or not self._sdpa_chunks(meta)

    def kernel_metadata(self, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(block_tables, seq_lens, query_start_loc) the kernel op is called with: the step's own, or when
        batch-invariant each query row as a sequence of its own (``rows_as_sequences``), built once per metadata."""
        if not self._batch_invariant or all(n == 1 for n in meta.query_lens):
            return meta.block_tables, meta.seq_lens, meta.query_start_loc
        if self._last_rows is None or self._last_rows[0] is not meta:
            self._last_rows = (meta, rows_as_sequences(meta))
        return self._last_rows[1]

    def _sdpa_chunks(self, meta: AttentionMetadata) -> list[tuple[int, int, int, int]]:
        """(sequence, first row, end row, cached context) of the prefill chunks the kernel leaves to SDPA."""
        if self._last_chunks is None or self._last_chunks[0] is not meta:
            chunks, start = [], 0
            for seq, (q_len, seq_len) in enumerate(zip(meta.query_lens, meta.seq_lens_list)):
                context = seq_len - q_len
                if q_len > 1 and (context == 0 or 0 < self.sdpa_from <= q_len):
                    chunks.append((seq, start, start + q_len, context))
                start += q_len
            self._last_chunks, self._masks, self._splits = (meta, chunks), {}, {}
        return self._last_chunks[1]

    def _fresh_split(self, chunks: list[tuple[int, int, int, int]], sliding_window: int | None
                     ) -> tuple[list[int], list[int], list[tuple[int, int, int, int]]]:
        """The first rows and lengths of the chunks the prefill kernel takes (no cached context, no
        window cutting into them) and the chunks left for SDPA; once per metadata and window."""
        window = sliding_window or 0
        if window not in self._splits:
            fresh = [c for c in chunks if c[3] == 0 and (not window or c[2] - c[1] <= window)]
            self._splits[window] = ([start for _, start, _, _ in fresh], [end - start for _, start, end, _ in fresh],
                                    [c for c in chunks if c not in fresh])
        return self._splits[window]

    def _mask(self, length: int, context: int, sliding_window: int | None,
              device: torch.device) -> torch.Tensor | None:
        """None for a plain causal chunk (SDPA's is_causal); else which keys each new row sees."""
        if context == 0 and (sliding_window is None or length <= sliding_window):
            return None
        key = (length, context, sliding_window or 0)
        if key not in self._masks:
            self._masks[key] = causal_mask(length, context, sliding_window, device)
        return self._masks[key]


def rows_as_sequences(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(block_tables, seq_lens, query_start_loc) with every query row of the step a sequence of one new token:
    row j of a chunk at position p keeps its sequence's block table and has p + 1 keys."""
    query_lens = torch.tensor(meta.query_lens, dtype=torch.int64)
    seq_of_row = torch.repeat_interleave(torch.arange(len(meta.query_lens)), query_lens)
    rows = seq_of_row.numel()
    row_in_chunk = torch.arange(rows) - meta.query_start_loc[:-1].index_select(0, seq_of_row)
    context = (meta.seq_lens - query_lens).index_select(0, seq_of_row)
    return (meta.block_tables.index_select(0, seq_of_row), context + row_in_chunk + 1,
            torch.arange(rows + 1, dtype=torch.int64))


def prefill_kernel(out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   starts: list[int], lens: list[int], scale: float) -> None:
    """out[s:s+n] = causal attention of query over key/value rows [s, s+n) for each chunk."""
    torch.ops.folovllm.prefill_attention(out, query, key, value, starts, lens, scale)


def heads_contiguous(x: torch.Tensor) -> torch.Tensor:
    """[T, H, D] with each token's heads side by side (rows may be strided, as in a slice of qkv)."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def gather_sequence(cache: torch.Tensor, table: torch.Tensor, length: int,
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """[length, Hkv, D]: one sequence's first ``length`` cached tokens, in order, out of its blocks (a
    quantized cache's dequantized to ``dtype``)."""
    block_size = cache.shape[1]
    blocks = table[:-(-length // block_size)]
    if quantized_format(cache) is None:
        return cache.index_select(0, blocks).flatten(0, 1)[:length]
    rows = cache.view(torch.uint8).index_select(0, blocks).flatten(0, 1)[:length]
    return dequantize_rows(rows.view(cache.dtype), dtype or torch.float32)


def causal_mask(length: int, context: int, sliding_window: int | None, device: torch.device) -> torch.Tensor:
    """[length, context + length] bool: new row i (at position context + i) sees keys up to itself,
    and within the window when there is one."""
    rows = torch.arange(context, context + length, device=device)[:, None]
    distance = rows - torch.arange(context + length, device=device)[None, :]
    visible = distance >= 0
    return visible & (distance < sliding_window) if sliding_window is not None else visible
