"""Logits processors: each adjusts one step's ``[N, V]`` logits in place, before temperature and sampling.

``LOGITS_PROCESSORS`` is the one ordered list. Each step, every kind builds itself from the batch's
sampling rows, or returns ``None`` when no row uses it, so a feature nobody asks for costs nothing.
Returned logprobs are those of the raw logits, before any processor (vLLM's default, "raw_logprobs").
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch

from folovllm.platforms import to_device
from folovllm.sample.rows import SamplingRow

__all__ = [
    "LOGITS_PROCESSORS",
    "AllowedTokenIdsProcessor",
    "BadWordsProcessor",
    "GrammarBitmaskProcessor",
    "LogitBiasProcessor",
    "LogitsProcessor",
    "MinTokensProcessor",
    "PenaltiesProcessor",
    "adjusts_row",
    "build_logits_processors",
]


class LogitsProcessor(ABC):
    """One batch-level adjustment of the logits, built per step from the rows that sample."""

    # True when it reads every earlier token of a row: overlap scheduling must then wait for the
    # token still pending on the device before building the next step.
    needs_sync: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> LogitsProcessor | None:
        """The processor for this step's rows (row ``i`` is logits row ``i``); None if no row uses it."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> None:
        """Adjusts contiguous float32 ``[N, V]`` logits in place."""


class PenaltiesProcessor(LogitsProcessor):
    """Repetition (prompt + output tokens; HF/vLLM: positive logits divided, negative multiplied),
    then frequency and presence penalties (output tokens; OpenAI semantics).

    Works on the seen tokens only (gather, adjust, scatter), never on the whole ``[N, V]``.
    A token listed several times is written several times with the same value.
    """

    needs_sync = True

    def __init__(self, repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
                 seen_index: torch.Tensor, seen_rows: torch.Tensor, output_index: torch.Tensor,
                 output_rows: torch.Tensor) -> None:
        self.repetition_penalty = repetition  # [N] float32
        self.frequency_penalty = frequency  # [N] float32
        self.presence_penalty = presence  # [N] float32
        # Flat indices into the [N * V] logits (row * V + token id), repeats kept; penalized rows only.
        self.seen_token_index = seen_index  # [T] every prompt and output token
        self.seen_token_rows = seen_rows  # [T] row of each
        self.output_token_index = output_index  # [T_out] every output token
        self.output_token_rows = output_rows  # [T_out] row of each

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> PenaltiesProcessor | None:
        penalized = [i for i, r in enumerate(rows) if r.params.has_penalties]
        if not penalized:
            return None

        def floats(values: list[float]) -> torch.Tensor:
            return to_device(values, torch.float32, device)

        output_index, output_rows = _flat_positions(
            [(i, rows[i].output_token_ids) for i in penalized], vocab_size, device)
        seen_index, seen_rows = _flat_positions(
            [(i, ids) for i in penalized for ids in (rows[i].prompt_token_ids, rows[i].output_token_ids)],
            vocab_size, device)
        return cls(floats([r.params.repetition_penalty for r in rows]),
                   floats([r.params.frequency_penalty for r in rows]),
                   floats([r.params.presence_penalty for r in rows]),
                   seen_index, seen_rows, output_index, output_rows)

    def apply(self, logits: torch.Tensor) -> None:
        flat = logits.view(-1)
        seen, seen_rows = self.seen_token_index, self.seen_token_rows
        values = flat[seen]
        repetition = self.repetition_penalty[seen_rows]
        flat[seen] = torch.where(values > 0, values / repetition, values * repetition)

        output, output_rows = self.output_token_index, self.output_token_rows
        flat.index_add_(0, output, -self.frequency_penalty[output_rows])  # once per occurrence
        flat[output] = flat[output] - self.presence_penalty[output_rows]  # once per distinct token


class MinTokensProcessor(LogitsProcessor):
    """A row with fewer than ``min_tokens`` outputs cannot sample a token that would end it."""

    def __init__(self, banned_rows: torch.Tensor, banned_cols: torch.Tensor) -> None:
        self.banned_rows = banned_rows  # [M] int64, with banned_cols: (row, token) pairs set to -inf
        self.banned_cols = banned_cols

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> MinTokensProcessor | None:
        banned = [(i, r.stop_token_ids) for i, r in enumerate(rows)
                  if r.num_output_tokens < r.params.min_tokens and r.stop_token_ids]
        if not banned:
            return None
        banned_rows = [i for i, ids in banned for _ in ids]
        banned_cols = list(itertools.chain.from_iterable(ids for _, ids in banned))
        return cls(to_device(banned_rows, torch.int64, device), to_device(banned_cols, torch.int64, device))

    def apply(self, logits: torch.Tensor) -> None:
        logits[self.banned_rows, self.banned_cols] = float("-inf")


class GrammarBitmaskProcessor(LogitsProcessor):
    """Structured outputs: a constrained row keeps only the tokens its grammar allows next.

    The bitmask is filled from the row's previous tokens, so overlap scheduling must wait for them.
    """

    needs_sync = True

    def __init__(self, rows: list[int], bitmask: torch.Tensor) -> None:
        self.rows = rows  # the constrained rows
        self.bitmask = bitmask  # [N, ceil(V / 32)] int32, bit t % 32 of word t // 32 = token t allowed

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> GrammarBitmaskProcessor | None:
        constrained = [i for i, r in enumerate(rows) if r.allowed_token_bitmask is not None]
        if not constrained:
            return None
        width = rows[constrained[0]].allowed_token_bitmask.shape[0]
        bitmask = np.full((len(rows), width), -1, dtype=np.int32)  # -1: every token allowed
        for i in constrained:
            bitmask[i] = rows[i].allowed_token_bitmask
        return cls(constrained, torch.from_numpy(bitmask).to(device, non_blocking=True))

    def apply(self, logits: torch.Tensor) -> None:
        # Imported here: xgrammar loads only once some request is constrained. Its kernels (C++ on
        # CPU, Triton/CUDA on GPU) unpack the bits where the logits are.
        from xgrammar import apply_token_bitmask_inplace

        apply_token_bitmask_inplace(logits, self.bitmask, vocab_size=logits.shape[1], indices=self.rows)



class AllowedTokenIdsProcessor(LogitsProcessor):
    """A row with ``allowed_token_ids`` can sample only those tokens: every other logit is -inf."""

    def __init__(self, rows: torch.Tensor, banned: torch.Tensor) -> None:
        self.rows = rows  # [M] int64: the rows that restrict their tokens
        self.banned = banned  # [M, V] bool: True where a token is not allowed

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> AllowedTokenIdsProcessor | None:
        restricted = [i for i, r in enumerate(rows) if r.params.allowed_token_ids is not None]
        if not restricted:
            return None
        allowed = [(m, rows[i].params.allowed_token_ids) for m, i in enumerate(restricted)]
        index, _ = _flat_positions(allowed, vocab_size, device)
        banned = torch.ones(len(restricted), vocab_size, dtype=torch.bool, device=device)
        banned.view(-1)[index] = False
        return cls(to_device(restricted, torch.int64, device), banned)

    def apply(self, logits: torch.Tensor) -> None:
        logits[self.rows] = logits[self.rows].masked_fill_(self.banned, float("-inf"))


class BadWordsProcessor(LogitsProcessor):
    """A row cannot complete one of its bad words: a word's last token is -inf when the tokens before
    it are the row's latest outputs (a one-token word is always banned)."""

    needs_sync = True  # reads the row's latest output tokens

    def __init__(self, banned_rows: torch.Tensor, banned_cols: torch.Tensor) -> None:
        self.banned_rows = banned_rows  # [M] int64, with banned_cols: (row, token) pairs set to -inf
        self.banned_cols = banned_cols

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> BadWordsProcessor | None:
        # Built whenever a row has bad words, even with nothing to ban now: needs_sync must hold.
        if not any(r.bad_words_token_ids for r in rows):
            return None
        banned = [(i, word[-1]) for i, r in enumerate(rows) for word in r.bad_words_token_ids
                  if _ends_with(r.output_token_ids, word[:-1])]
        return cls(to_device([i for i, _ in banned], torch.int64, device),
                   to_device([t for _, t in banned], torch.int64, device))

    def apply(self, logits: torch.Tensor) -> None:
        logits[self.banned_rows, self.banned_cols] = float("-inf")


class LogitBiasProcessor(LogitsProcessor):
    """Adds each row's ``logit_bias`` to the logits of its token ids."""

    def __init__(self, index: torch.Tensor, bias: torch.Tensor) -> None:
        self.index = index  # [T] int64 flat positions (row * V + token id), distinct
        self.bias = bias  # [T] float32

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              device: torch.device | str) -> LogitBiasProcessor | None:
        biased = [(i, r.params.logit_bias) for i, r in enumerate(rows) if r.params.logit_bias]
        if not biased:
            return None
        index, _ = _flat_positions([(i, list(bias)) for i, bias in biased], vocab_size, device)
        values = [float(b) for _, bias in biased for b in bias.values()]
        return cls(index, to_device(values, torch.float32, device))

    def apply(self, logits: torch.Tensor) -> None:
        logits.view(-1).index_add_(0, self.index, self.bias)



# The order they apply in: the grammar's mask first, then the token constraints and the bias on the raw
# logits, then the penalties; a new processor goes here (after these, unless it must see raw logits).
LOGITS_PROCESSORS: tuple[type[LogitsProcessor], ...] = (
    GrammarBitmaskProcessor,
    AllowedTokenIdsProcessor,
    BadWordsProcessor,
    LogitBiasProcessor,
    PenaltiesProcessor,
    MinTokensProcessor,
)


def build_logits_processors(rows: Sequence[SamplingRow], vocab_size: int,
                            device: torch.device | str) -> list[LogitsProcessor]:
    """This step's processors, in ``LOGITS_PROCESSORS`` order, leaving out those no row uses."""
    processors = []
    for kind in LOGITS_PROCESSORS:
        processor = kind.build(rows, vocab_size, device)
        if processor is not None:
            processors.append(processor)
    return processors


def adjusts_row(row: SamplingRow) -> bool:
    """Whether a batch holding this row gets some processor (the ``build`` conditions above, for one row);
    a test keeps the two in step."""
    params = row.params
    return (row.allowed_token_bitmask is not None or params.allowed_token_ids is not None
            or bool(row.bad_words_token_ids) or bool(params.logit_bias) or params.has_penalties
            or (row.num_output_tokens < params.min_tokens and bool(row.stop_token_ids)))


def _ends_with(tokens: Sequence[int], suffix: Sequence[int]) -> bool:
    """Whether ``tokens`` ends with ``suffix`` (always, for an empty suffix)."""
    n = len(suffix)
    return n == 0 or (len(tokens) >= n and list(tokens[-n:]) == list(suffix))


def _flat_positions(
    rows_and_ids: list[tuple[int, Sequence[int]]], vocab_size: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``[N * V]`` positions (row * V + token id) of the given tokens, and their rows."""
    index = [row * vocab_size + t for row, ids in rows_and_ids for t in ids]
    rows = [row for row, ids in rows_and_ids for _ in ids]
    return (
        to_device(index, torch.int64, device),
        to_device(rows, torch.int64, device),
    )
