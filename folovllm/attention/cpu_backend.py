"""Paged attention with a C++ kernel for CPU that reads K/V in place through the block table.

The kernel (csrc/cpu_attention.cpp, built by ``make kernels``) runs decode rows and prefill chunks over
cached context in a single call per layer, flash-style over key tiles with fp32 accumulation; the torch
backend instead gathers every sequence's blocks into contiguous tensors each step. A prefill chunk with no
cached context has its K/V contiguous already: it goes to SDPA, whose GEMM tiles beat the kernel there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from folovllm.attention.backend import check_sliding_window, register_attention_backend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.attention.torch_backend import write_kv_cache
from folovllm.config import CPU_ATTENTION_LIBRARY, load_cpu_attention_library


@register_attention_backend("cpu")
class CpuAttentionBackend:
    """CPU only; float32 or bfloat16, any block size, num_heads a multiple of num_kv_heads.

    Every layer of a step is called with the same metadata object, so the step's fresh prefill chunks
    (and their sliding-window masks) are built once per metadata object (as in the torch backend: build
    a new one each step).
    """

    def __init__(self) -> None:
        reason = load_cpu_attention_library(CPU_ATTENTION_LIBRARY)
        if reason is not None:
            raise RuntimeError(f"attention_backend 'cpu' is unavailable: {reason} "
                               "(or choose attention_backend 'torch')")
        self._op = torch.ops.folovllm_cpu.paged_attention
        self._last_chunks: tuple[AttentionMetadata, list[tuple[int, int]]] | None = None
        self._masks: dict[tuple[int, int], torch.Tensor] = {}  # (length, window) -> band, for that metadata

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
        if query.device.type != "cpu":
            raise ValueError(f"the cpu attention backend runs on CPU tensors; got {query.device}: use "
                             "attention_backend 'triton' or 'torch'")
        check_sliding_window(sliding_window)
        if not kv_stored:  # the fused rotary op stored them already
            write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        query = query.contiguous()  # q is often a slice of a fused qkv projection
        out = torch.empty_like(query)
        self._op(out, query, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale,
                 True, sliding_window or 0)
        for start, end in self._fresh_chunks(meta):
            # a chunk no longer than the window is plain causal; a longer one needs the band mask
            mask = None if sliding_window is None or end - start <= sliding_window else (
                self._band(end - start, sliding_window, query.device))
            # 4-D [1, H, L, D]: SDPA takes its fused CPU kernel only for batched inputs
            out[start:end] = F.scaled_dot_product_attention(
                query[start:end].transpose(0, 1)[None], key[start:end].transpose(0, 1)[None],
                value[start:end].transpose(0, 1)[None], attn_mask=mask, is_causal=mask is None, scale=scale,
                enable_gqa=num_heads != key.shape[1])[0].transpose(0, 1)
        return out.view(num_tokens, num_heads * head_dim)

    def _fresh_chunks(self, meta: AttentionMetadata) -> list[tuple[int, int]]:
        """Rows of the prefill chunks with no cached context: the kernel leaves them to SDPA."""
        if self._last_chunks is None or self._last_chunks[0] is not meta:
            chunks, start = [], 0
            for q_len, seq_len in zip(meta.query_lens, meta.seq_lens_list):
                if q_len > 1 and q_len == seq_len:
                    chunks.append((start, start + q_len))
                start += q_len
            self._last_chunks, self._masks = (meta, chunks), {}
        return self._last_chunks[1]

    def _band(self, length: int, sliding_window: int, device: torch.device) -> torch.Tensor:
        if (length, sliding_window) not in self._masks:
            self._masks[length, sliding_window] = sliding_window_mask(length, sliding_window, device)
        return self._masks[length, sliding_window]


def sliding_window_mask(length: int, sliding_window: int, device: torch.device) -> torch.Tensor:
    """[length, length] bool: query i sees keys i - sliding_window + 1 .. i (a causal band)."""
    pos = torch.arange(length, device=device)
    distance = pos[:, None] - pos[None, :]
    return (distance >= 0) & (distance < sliding_window)
