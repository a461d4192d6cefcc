"""The sampling settings of the rows that score proposals: each as if the proposals before it were output."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from folovllm.sample.rows import SamplingRow


def draft_rows(row: SamplingRow, drafts: Sequence[int], bitmasks: Sequence[np.ndarray] | None) -> list[SamplingRow]:
    """Row ``j`` (1-based) scores the token after ``drafts[:j]``: min_tokens counts them, penalties and
    bad words read them (when the row carries its output), the grammar's bitmask is the one after them."""
    rows = []
    for j in range(1, len(drafts) + 1):
        output = list(row.output_token_ids) + list(drafts[:j]) if row.output_token_ids else row.output_token_ids
        rows.append(dataclasses.replace(row, num_output_tokens=row.num_output_tokens + j, output_token_ids=output,
                                        allowed_token_bitmask=None if bitmasks is None else bitmasks[j - 1]))
    return rows
