"""The paged KV layout's arithmetic, shared by the KV cache manager, the runner and the backends."""
from __future__ import annotations


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """How many blocks of ``block_size`` slots hold ``num_tokens`` tokens (rounded up)."""
    return -(-num_tokens // block_size)
