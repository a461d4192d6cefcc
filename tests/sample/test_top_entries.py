"""Top-k logprobs in one order (highest first, equal values by ascending id), whatever k and the other rows."""
from __future__ import annotations

import torch

from folovllm.sample.top_entries import top_entries


def test_ties_go_to_the_lower_id_whatever_k_and_the_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = (torch.randn(9, 3000, generator=gen) * 4).round() / 4  # many exact ties, as bf16 logits give
    for k in (1, 2, 5, 20):
        values, ids = top_entries(rows, k)
        assert torch.equal(values, rows.topk(k, dim=-1).values)  # the same k largest values
        assert torch.equal(rows.gather(1, ids), values)
        same_value = values[:, 1:] == values[:, :-1]
        assert bool((ids[:, 1:] > ids[:, :-1])[same_value].all())  # equal values by ascending id
        wider_values, wider_ids = top_entries(rows, k + 3)
        assert torch.equal(wider_ids[:, :k], ids)
        for r in (0, 4):
            assert torch.equal(top_entries(rows[r:r + 1], k)[1], ids[r:r + 1])


def test_no_entries_and_all_equal_rows() -> None:
    values, ids = top_entries(torch.zeros(2, 7), 0)
    assert values.shape == ids.shape == (2, 0)
    values, ids = top_entries(torch.zeros(2, 7), 3)
    assert ids.tolist() == [[0, 1, 2], [0, 1, 2]] and values.tolist() == [[0.0] * 3] * 2
