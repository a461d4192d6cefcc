"""Each row's k largest logprobs in one order: highest first, equal ones by ascending token id.

``topk`` picks among equal values by its own algorithm, which changes with k and the row count; bf16 logits
make such ties common (several tokens one logprob apart by nothing). A batch asks for the largest k any of
its rows wants, so a row's reported entries would move with its company.
"""
from __future__ import annotations

import torch


def top_entries(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids), each ``[N, k]``: row r's k largest entries of ``logprobs [N, V]``, highest first, equal
    values by ascending id, so the first j of them are the same whatever k >= j is asked."""
    rows_count = logprobs.shape[0]
    if k == 0:
        return logprobs.new_empty(rows_count, 0), torch.empty(rows_count, 0, dtype=torch.int64, device=logprobs.device)
    kth = logprobs.topk(k, dim=-1).values[:, -1:]  # the k largest values are one multiset, whichever ids
    rows, ids = torch.nonzero(logprobs >= kth, as_tuple=True)  # row by row, ids ascending
    values = logprobs[rows, ids]
    order = torch.sort(values, descending=True, stable=True).indices
    order = order[torch.sort(rows[order], stable=True).indices]  # by row; in a row by value, then by id
    counts = torch.bincount(rows, minlength=rows_count)
    first = torch.cumsum(counts, 0) - counts
    picked = order[(first[:, None] + torch.arange(k, device=logprobs.device)).flatten()]
    return values[picked].view(rows_count, k), ids[picked].view(rows_count, k)
