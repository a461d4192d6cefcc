"""Exp(1) noise for seeded rows without drawing from a generator per row: each value is hashed from the row's
seed, its output count (the n of the n-th output token it samples: the key CUDA's counter-keyed draw uses) and
the candidate token's id.

A seeded request's noise for its n-th token depends on nothing else (not its neighbours, not how many values were
drawn before), so its tokens are reproducible whatever the batch, and every seeded row is hashed in one pass
of elementwise integer ops. The hash works on 32-bit values inside int64 with multipliers below 2**31, so no
product leaves the int64 range on any device.
"""
from __future__ import annotations

import torch

_LOW32 = 0xFFFFFFFF
_MULTIPLIER = 0x45D9F3B  # an odd 28-bit multiplier with good avalanche in this two-round mix
_GOLDEN = 0x9E3779B1  # spreads consecutive token ids before they are mixed with the row's key


def fold_seed(seed: int) -> int:
    """A seed of any size as the 32-bit key the hash starts from."""
    seed &= (1 << 64) - 1
    return (seed ^ (seed >> 32)) & _LOW32


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = ((x >> 16) ^ x) * _MULTIPLIER & _LOW32
    x = ((x >> 16) ^ x) * _MULTIPLIER & _LOW32
    return (x >> 16) ^ x


def seeded_exponential(seed_keys: torch.Tensor, counters: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``[rows, k]`` float32 Exp(1) values: row ``i``'s value for token ``token_ids[i, j]`` from its folded seed
    ``seed_keys[i]`` and its output count ``counters[i]`` (each strictly positive)."""
    row_key = _mix(_mix(seed_keys & _LOW32) ^ (counters & _LOW32))
    bits = _mix(row_key.unsqueeze(1) ^ (token_ids * _GOLDEN & _LOW32))
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * 2.0 ** -24  # in (0, 1): 24 bits, none at either end
    return uniform.log_().neg_()
