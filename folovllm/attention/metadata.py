"""What the attention backend needs to know about one ragged batch (built once per step)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Describes one ragged step batch: sequences laid end to end, no padding.

    Sequence ``i`` contributes ``query_lens[i]`` new tokens (a prefill chunk, or 1 when decoding);
    after this step it has ``seq_lens[i]`` tokens in the KV cache (previously computed + new).
    Its new tokens are rows ``query_start_loc[i]:query_start_loc[i+1]`` of the batch.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot each new token's K/V is written to
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64 prefix sums of query_lens
    seq_lens: torch.Tensor  # [num_seqs] int64: context length after this step
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int64, padded with 0
    query_lens: list[int]  # host copies, so backends can split work without a device sync
    seq_lens_list: list[int]
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)
