"""The attention backend interface: paged-KV attention over one ragged step batch, and its registry."""
from __future__ import annotations

from typing import Protocol

import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.registry import Registry


class AttentionBackend(Protocol):
    """Writes this step's K/V into the paged cache, then attends each query over its sequence."""

    def forward(
        self,
        query: torch.Tensor,  # [T, num_heads, head_dim]
        key: torch.Tensor,  # [T, num_kv_heads, head_dim]
        value: torch.Tensor,  # [T, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        kv_stored: bool = False,
    ) -> torch.Tensor:  # [T, num_heads * head_dim]
        """Store key/value at ``meta.slot_mapping``, then return causal attention of every query token
        over its own sequence's whole context (cached earlier tokens + this step's tokens).

        ``sliding_window`` (the calling layer's own): a query at position p sees only the keys at
        positions p - sliding_window + 1 .. p; None sees the whole context. ``kv_stored``: the caller
        has stored this step's key/value at their slots already (the fused CPU rotary op)."""
        ...


def check_sliding_window(sliding_window: int | None) -> None:
    """ValueError unless the window is None or a positive number of positions."""
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be a positive number of positions or None; got {sliding_window}")


ATTENTION_BACKENDS: Registry[type] = Registry("attention backend")
register_attention_backend = ATTENTION_BACKENDS.register


def _import_builtin_backends() -> None:
    # Each backend registers itself when its module is imported (triton itself loads only when built,
    # the cpu kernel's library too).
    import folovllm.attention.cpu_backend  # noqa: F401
    import folovllm.attention.torch_backend  # noqa: F401
    import folovllm.attention.triton_backend  # noqa: F401


def attention_backend_names() -> list[str]:
    """Names ``attention_backend`` accepts (besides ``auto``), sorted: import order varies."""
    _import_builtin_backends()
    return sorted(ATTENTION_BACKENDS.names())


def get_attention_backend(name: str = "torch", batch_invariant: bool = False) -> AttentionBackend:
    """Return an attention backend by name.

    "torch": pure PyTorch, runs on any device. "cpu": a C++ kernel reading the paged cache in place
    (built by ``make kernels``). "triton": Triton kernels for CUDA (CUDA-graph safe);
    on CPU only under Triton's interpreter (``TRITON_INTERPRET=1``, tests). ``batch_invariant``: the
    backend's batch-invariant form (each query row's keys reduced in an order fixed by their positions,
    whatever else is in the step); ValueError for a backend without one.
    """
    _import_builtin_backends()
    cls = ATTENTION_BACKENDS.get(name)
    if not batch_invariant:
        return cls()
    if not getattr(cls, "has_batch_invariant_form", False):
        raise ValueError(f"attention backend {name!r} has no batch-invariant form; use cpu, torch or triton")
    return cls(batch_invariant=True)
