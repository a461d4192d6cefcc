"""Small shared test utilities."""
from __future__ import annotations

import torch

from folovllm.attention.metadata import AttentionMetadata


def make_attn_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Metadata for a ragged batch: sequence i adds query_lens[i] tokens ending at seq_lens[i]."""
    slots = []
    for q_len, s_len, table in zip(query_lens, seq_lens, block_tables):
        for pos in range(s_len - q_len, s_len):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    width = max(len(t) for t in block_tables)
    padded = [t + [0] * (width - len(t)) for t in block_tables]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int64, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int64, device=device),
        query_lens=list(query_lens),
        seq_lens_list=list(seq_lens),
        block_size=block_size,
    )


class BlockPool:
    """Hands out shuffled block ids so block tables are non-contiguous, like a real cache after churn."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_blocks, generator=gen).tolist()

    def grow(self, table: list[int], num_tokens: int, block_size: int) -> list[int]:
        """Append blocks to ``table`` until it holds ``num_tokens`` tokens."""
        while len(table) * block_size < num_tokens:
            table.append(self.free.pop())
        return table
