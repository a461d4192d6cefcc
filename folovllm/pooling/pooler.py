"""Pooling on the worker: each request's final normed hidden states, over all its prefill chunks, as one result.

A pooling request is prefill only. Each step that computes part of its prompt hands the pooler that
chunk's rows; what a later chunk still needs is kept per request (MEAN: the running sum; CLS: the
first row; ALL: every row so far), and the chunk that ends the prompt gives the pooled result. A chunk
starting at position 0 starts the request afresh (a preempted request recomputes from there).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class PoolingRow:
    """How one request is pooled: the engine's pooling type, and the request's finishing touches."""

    pooling_type: str  # one of pooling.config.POOLING_TYPES
    normalize: bool  # to unit L2 norm (each row's, for ALL), after truncating to ``dimensions``
    dimensions: int | None = None  # keep the first this many components (Matryoshka)


@dataclass(frozen=True, slots=True)
class PoolingChunk:
    """One request's rows in a step's hidden states: ``num_rows`` rows from ``first_row``, holding
    positions ``first_position...``; ``done`` when they end its prompt."""

    request_id: str
    first_row: int
    num_rows: int
    first_position: int
    row: PoolingRow
    done: bool


class Pooler:
    """Pools the chunks of each step; keeps what an unfinished request's later chunks need."""

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """``head``: a cross-encoder's score head, [N, hidden] -> [N, num_labels], applied to every pooled
        vector; None: the vectors are the results."""
        self.head = head
        self._partial: dict[str, torch.Tensor | list[torch.Tensor]] = {}  # request id -> sum, row or rows

    def forget(self, request_id: str) -> None:
        """The request ended (finished or aborted): drop what was kept for it."""
        self._partial.pop(request_id, None)

    def pool(self, hidden: torch.Tensor, chunks: list[PoolingChunk]) -> list[tuple[str, torch.Tensor]]:
        """(request id, pooled float32 result) for every chunk that ends its request's prompt, in order:
        a vector, or for ALL one row per prompt token."""
        results = []
        for chunk in chunks:
            rows = hidden[chunk.first_row:chunk.first_row + chunk.num_rows]
            pooled = self._add(chunk, rows)
            if chunk.done:
                self._partial.pop(chunk.request_id, None)
                if self.head is not None:
                    pooled = self.head(pooled[None])[0]
                results.append((chunk.request_id, finish(pooled, chunk.row)))
        return results

    def _add(self, chunk: PoolingChunk, rows: torch.Tensor) -> torch.Tensor | None:
        """Takes the chunk's rows into the request's state; the pooled result once ``done``."""
        kind, request_id, fresh = chunk.row.pooling_type, chunk.request_id, chunk.first_position == 0
        if kind == "LAST":
            return rows[-1].float() if chunk.done else None
        if kind == "CLS":
            first = rows[0].float() if fresh else self._partial[request_id]
            if not chunk.done:
                self._partial[request_id] = first
            return first
        if kind == "MEAN":
            total = rows.float().sum(dim=0)
            if not fresh:
                total += self._partial[request_id]
            if not chunk.done:
                self._partial[request_id] = total
            return total / (chunk.first_position + chunk.num_rows)
        parts = [] if fresh else self._partial[request_id]  # ALL
        parts.append(rows.float())
        if not chunk.done:
            self._partial[request_id] = parts
            return None
        return torch.cat(parts)


def finish(pooled: torch.Tensor, row: PoolingRow) -> torch.Tensor:
    """Matryoshka truncation to ``dimensions``, then L2 normalization when asked (per row for ALL)."""
    if row.dimensions is not None:
        pooled = pooled[..., :row.dimensions]
    return F.normalize(pooled, p=2, dim=-1) if row.normalize else pooled
