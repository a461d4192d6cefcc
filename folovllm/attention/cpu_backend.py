"""Paged attention with a C++ kernel for CPU that reads K/V in place through the block table.

The kernel (csrc/cpu_attention.cpp, built by ``make kernels``) runs decode rows and chunked-prefill
rows of one ragged batch in a single call, flash-style over key tiles with fp32 accumulation; the
torch backend instead gathers every sequence's blocks into contiguous tensors each step.
"""
from __future__ import annotations

import torch

from folovllm.attention.backend import register_attention_backend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.attention.torch_backend import write_kv_cache
from folovllm.config import CPU_ATTENTION_LIBRARY, load_cpu_attention_library


@register_attention_backend("cpu")
class CpuAttentionBackend:
    """CPU only; float32 or bfloat16, any block size, num_heads a multiple of num_kv_heads."""

    def __init__(self) -> None:
        reason = load_cpu_attention_library(CPU_ATTENTION_LIBRARY)
        if reason is not None:
            raise RuntimeError(f"attention_backend 'cpu' is unavailable: {reason} "
                               "(or choose attention_backend 'torch')")
        self._op = torch.ops.folovllm_cpu.paged_attention

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        if query.device.type != "cpu":
            raise ValueError(f"the cpu attention backend runs on CPU tensors; got {query.device}: use "
                             "attention_backend 'triton' or 'torch'")
        write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        query = query.contiguous()  # q is often a slice of a fused qkv projection
        out = torch.empty_like(query)
        self._op(out, query, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale)
        return out.view(num_tokens, num_heads * head_dim)
