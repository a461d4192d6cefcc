"""Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's suffix."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def propose_ngram(token_ids: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``num_tokens`` tokens: for the longest suffix of ``min_n..max_n`` tokens seen before,
    what followed its most recent earlier occurrence (empty when no suffix recurs)."""
    total = len(token_ids)
    if num_tokens < 1 or total <= min_n:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        # windows starting at 0 .. total-n-1: every earlier occurrence, the suffix itself left out
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:total - 1], n)
        hits = np.flatnonzero((windows == tokens[total - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + num_tokens].tolist()
    return []
