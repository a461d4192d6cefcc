"""Paged attention with Triton kernels: one KV-store launch and one attention launch per layer (a decode
step's attention split over the context: two, ``FOLOVLLM_TRITON_SPLIT_DECODE``).

The work is planned on the device from ``AttentionMetadata``'s tensors only (no host lists, no
device-to-host copies), so a decode step through this backend can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch

from folovllm import envs
from folovllm.attention.backend import check_sliding_window, register_attention_backend
from folovllm.attention.kv_quant import quantized_format, write_quantized_kv
from folovllm.attention.metadata import AttentionMetadata


@register_attention_backend("triton")
class TritonAttentionBackend:
    """Fast path for CUDA; on CPU it runs only under Triton's interpreter (``TRITON_INTERPRET=1``). A quantized
    cache (attention/kv_quant.py) is written by the torch reference's quantizer (plain tensor ops, which a CUDA
    graph captures) and dequantized inside the attention kernel."""

    takes_quantized_kv = True
    has_batch_invariant_form = True

    def __init__(self, batch_invariant: bool = False) -> None:
        """``batch_invariant``: every query tile of one shape, key tiles at fixed positions and no decode split
        over the context (``triton_kernels.paged_attention``'s ``fixed_tiles``)."""
        from folovllm.attention import triton_kernels  # imports triton only when this backend is chosen

        self._kernels = triton_kernels
        self._batch_invariant = batch_invariant
        # decode steps split over the context (None: as far as fills the GPU) or not (1); their merge's tickets
        # (how far a split goes follows the batch's shape: never in batch-invariant mode)
        self._num_splits = None if envs.switch("FOLOVLLM_TRITON_SPLIT_DECODE") and not batch_invariant else 1
        self._tickets = triton_kernels.DecodeTickets()

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
        self._check(query, k_cache, v_cache)
        check_sliding_window(sliding_window)
        fmt = quantized_format(k_cache)
        if not kv_stored and fmt is not None:
            write_quantized_kv(key, value, k_cache, v_cache, meta.slot_mapping, fmt)
        elif not kv_stored:
            self._kernels.store_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        out = self._kernels.paged_attention(query, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                            meta.query_start_loc, scale, sliding_window=sliding_window,
                                            num_splits=self._num_splits, tickets=self._tickets,
                                            fixed_tiles=self._batch_invariant)
        return out.view(num_tokens, num_heads * head_dim)

    @staticmethod
    def _check(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        head_dim, num_heads, num_kv_heads = query.shape[2], query.shape[1], k_cache.shape[2]
        if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
            raise ValueError(f"the triton attention backend needs head_dim a power of two in [16, 256]; "
                             f"got {head_dim}: use attention_backend='torch'")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
            raise ValueError("the K and V caches must share one layout with unit stride along head_dim")
