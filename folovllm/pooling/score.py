"""Scores from embeddings: texts paired as vLLM pairs them, each pair's cosine similarity."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F

T = TypeVar("T")


def pair_up(first: T | Sequence[T], second: T | Sequence[T], single: type | tuple[type, ...]) -> tuple[list[T], list[T]]:
    """The pairs to score, as two aligned lists: one to one, one to many (the one repeated), or N to N.
    An item of type ``single`` counts as one text (a string, a token-id list...)."""
    firsts = [first] if isinstance(first, single) else list(first)
    seconds = [second] if isinstance(second, single) else list(second)
    if not firsts or not seconds:
        raise ValueError("score needs at least one text on each side")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(firsts) != len(seconds):
        raise ValueError(f"score pairs one text with many, or N texts with N: got {len(firsts)} and {len(seconds)}")
    return firsts, seconds


def cosine_scores(firsts: Sequence[Sequence[float]], seconds: Sequence[Sequence[float]]) -> list[float]:
    """Each pair's cosine similarity, in float32."""
    a = torch.tensor(firsts, dtype=torch.float32)
    b = torch.tensor(seconds, dtype=torch.float32)
    return F.cosine_similarity(a, b, dim=-1).tolist()
