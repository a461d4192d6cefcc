"""Per-step sampling settings for a batch of rows, packed into tensors once per engine step."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from folovllm.sampling_params import SamplingParams
from folovllm.tensors import to_device

_GREEDY_EPS = 1e-5  # same threshold as SamplingParams.greedy


@dataclass
class SamplingBatch:
    """What the sampler needs for one ``[N, V]`` logits batch; row ``i`` is one sequence.

    Optional tensors are ``None`` when no row uses that feature, so the sampler can skip it.
    """

    num_rows: int
    vocab_size: int
    all_greedy: bool
    all_random: bool
    greedy_mask: torch.Tensor | None  # [N] bool; None when all rows are greedy or all random
    temperature: torch.Tensor | None  # [N] float32, 1.0 on greedy rows; None when all greedy
    top_k: torch.Tensor | None  # [N] int64 in [1, V] (V = disabled)
    top_p: torch.Tensor | None  # [N] float32 (1.0 = disabled)
    min_p: torch.Tensor | None  # [N] float32 (0.0 = disabled)
    # Penalties: all set together, or all None. Token positions are flat indices into the
    # [N * V] logits (row * V + token id), repeats kept; only rows with a penalty are listed.
    repetition_penalty: torch.Tensor | None  # [N] float32
    frequency_penalty: torch.Tensor | None  # [N] float32
    presence_penalty: torch.Tensor | None  # [N] float32
    seen_token_index: torch.Tensor | None  # [T] int64: every prompt and output token
    seen_token_rows: torch.Tensor | None  # [T] int64: row of each
    output_token_index: torch.Tensor | None  # [T_out] int64: every output token
    output_token_rows: torch.Tensor | None  # [T_out] int64: row of each
    banned_rows: torch.Tensor | None  # [M] int64 with banned_cols: (row, token) pairs set to -inf
    banned_cols: torch.Tensor | None
    generators: dict[int, torch.Generator]  # row -> its own RNG (seeded requests)
    num_logprobs: list[int | None]  # per row: params.logprobs
    max_num_logprobs: int | None  # None when no row wants logprobs
    max_top_k: int | None = None  # the largest k of top_k, kept on the host (no device sync to read it)

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty is not None

    @property
    def is_plain_greedy(self) -> bool:
        """All rows greedy with nothing to adjust or report: the sampler just takes argmax."""
        return (
            self.all_greedy
            and not self.needs_penalties
            and self.banned_rows is None
            and self.max_num_logprobs is None
        )


def build_sampling_batch(
    params: list[SamplingParams],
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
    generators: list[torch.Generator | None],
    banned_token_ids: list[list[int]],
    vocab_size: int,
    device: torch.device | str,
) -> SamplingBatch:
    """Pack per-row settings into tensors on ``device``.

    ``banned_token_ids[i]`` are masked to -inf for row ``i`` this step (e.g. EOS and stop ids
    while ``len(output) < min_tokens``). ``generators[i]`` is row ``i``'s own RNG or ``None``
    for the default RNG. Token lists are only read when some row uses a penalty.
    """
    num_rows = len(params)
    for name, values in (
        ("prompt_token_ids", prompt_token_ids),
        ("output_token_ids", output_token_ids),
        ("generators", generators),
        ("banned_token_ids", banned_token_ids),
    ):
        if len(values) != num_rows:
            raise ValueError(f"{name} has {len(values)} rows but params has {num_rows}.")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}.")

    greedy = [p.temperature < _GREEDY_EPS for p in params]
    all_greedy = all(greedy)
    all_random = not any(greedy)
    penalized = [i for i, p in enumerate(params) if _has_penalty(p)]
    num_logprobs = [p.logprobs for p in params]
    wanted = [n for n in num_logprobs if n is not None]

    def floats(values: list[float]) -> torch.Tensor:
        return to_device(values, torch.float32, device)

    greedy_mask = temperature = top_k = top_p = min_p = max_top_k = None
    if not all_greedy:
        temperature = floats([1.0 if g else p.temperature for p, g in zip(params, greedy)])
        if not all_random:
            greedy_mask = to_device(greedy, torch.bool, device)
        if any(p.top_k != -1 and p.top_k < vocab_size for p in params):
            ks = [vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params]
            top_k, max_top_k = to_device(ks, torch.int64, device), max(ks)
        if any(p.top_p < 1.0 for p in params):
            top_p = floats([p.top_p for p in params])
        if any(p.min_p > 0.0 for p in params):
            min_p = floats([p.min_p for p in params])

    repetition = frequency = presence = None
    seen_index = seen_rows = output_index = output_rows = None
    if penalized:
        repetition = floats([p.repetition_penalty for p in params])
        frequency = floats([p.frequency_penalty for p in params])
        presence = floats([p.presence_penalty for p in params])
        output_index, output_rows = _flat_positions(
            [(i, output_token_ids[i]) for i in penalized], vocab_size, device
        )
        seen_index, seen_rows = _flat_positions(
            [(i, ids) for i in penalized for ids in (prompt_token_ids[i], output_token_ids[i])],
            vocab_size,
            device,
        )

    banned_rows = banned_cols = None
    if any(banned_token_ids):
        rows = [i for i, ids in enumerate(banned_token_ids) for _ in ids]
        banned_rows = to_device(rows, torch.int64, device)
        banned_cols = to_device(list(itertools.chain.from_iterable(banned_token_ids)), torch.int64, device)

    return SamplingBatch(
        num_rows=num_rows,
        vocab_size=vocab_size,
        all_greedy=all_greedy,
        all_random=all_random,
        greedy_mask=greedy_mask,
        temperature=temperature,
        top_k=top_k,
        max_top_k=max_top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
        seen_token_index=seen_index,
        seen_token_rows=seen_rows,
        output_token_index=output_index,
        output_token_rows=output_rows,
        banned_rows=banned_rows,
        banned_cols=banned_cols,
        generators={i: g for i, g in enumerate(generators) if g is not None and not greedy[i]},
        num_logprobs=num_logprobs,
        max_num_logprobs=max(wanted) if wanted else None,
    )


def _has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def _flat_positions(
    rows_and_ids: list[tuple[int, list[int]]], vocab_size: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``[N * V]`` positions (row * V + token id) of the given tokens, and their rows."""
    index = [row * vocab_size + t for row, ids in rows_and_ids for t in ids]
    rows = [row for row, ids in rows_and_ids for _ in ids]
    return (
        to_device(index, torch.int64, device),
        to_device(rows, torch.int64, device),
    )
