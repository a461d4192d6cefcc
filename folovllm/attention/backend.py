"""The attention backend interface: paged-KV attention over one ragged step batch."""
from __future__ import annotations

from typing import Protocol

import torch

from folovllm.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    """Writes this step's K/V into the paged cache, then attends each query over its sequence."""

    name: str

    def forward(
        self,
        query: torch.Tensor,  # [T, num_heads, head_dim]
        key: torch.Tensor,  # [T, num_kv_heads, head_dim]
        value: torch.Tensor,  # [T, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, num_heads * head_dim]
        """Store key/value at ``meta.slot_mapping``, then return causal attention of every query token
        over its own sequence's whole context (cached earlier tokens + this step's tokens)."""
        ...


def get_attention_backend(name: str = "torch") -> AttentionBackend:
    """Return an attention backend by name.

    "torch": pure PyTorch, runs on any device. "triton": Triton kernels for CUDA (CUDA-graph safe);
    on CPU only under Triton's interpreter (``TRITON_INTERPRET=1``, tests).
    """
    if name == "torch":
        from folovllm.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from folovllm.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; supported: ['torch', 'triton']")


def default_attention_backend(device: torch.device) -> str:
    """What attention_backend="auto" means: "triton" on CUDA when triton imports, else "torch"."""
    if device.type != "cuda":
        return "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"
