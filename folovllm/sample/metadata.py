"""Per-step sampling settings: plain per-row data in, a batch of tensors for the sampler out."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from folovllm.platforms import to_device
from folovllm.sample.logits_processors import LogitsProcessor, adjusts_row, build_logits_processors
from folovllm.sample.rows import SamplingRow
from folovllm.sample.seeded_noise import fold_seed

__all__ = ["SamplingBatch", "SamplingRow", "build_sampling_batch", "is_plain_greedy_row", "noise_keys",
           "with_noise_keys"]


@dataclass
class SamplingBatch:
    """What the sampler needs for one ``[N, V]`` logits batch; row ``i`` is one sequence.

    Optional tensors are ``None`` when no row uses that feature, so the sampler can skip it.
    """

    num_rows: int
    vocab_size: int
    all_greedy: bool
    greedy_mask: torch.Tensor | None  # [N] bool; None when all rows are greedy or all random
    temperature: torch.Tensor | None  # [N] float32, 1.0 on greedy rows; None when all greedy
    top_k: torch.Tensor | None  # [N] int64 in [1, V] (V = disabled)
    top_p: torch.Tensor | None  # [N] float32 (1.0 = disabled)
    min_p: torch.Tensor | None  # [N] float32 (0.0 = disabled)
    generators: dict[int, torch.Generator]  # row -> its own RNG (seeded requests)
    num_logprobs: list[int | None]  # per row: params.logprobs
    max_num_logprobs: int | None  # None when no row wants logprobs
    max_top_k: int | None = None  # the largest k of top_k, kept on the host (no device sync to read it)
    # the random rows with a top_k below the vocabulary (their tokens lie among their top k logits) and the
    # largest of those k (None: no such row); each row's k on the host
    candidate_rows: list[int] = field(default_factory=list)
    candidate_k: int | None = None
    top_k_list: list[int] = field(default_factory=list)
    num_greedy_rows: int = 0
    # the random rows with a seed: a mask and each row's folded seed (0 where it has none), for the candidate
    # path's hashed noise (sample/seeded_noise.py); None when no random row has a seed
    seeded: torch.Tensor | None = None
    seed_keys: torch.Tensor | None = None
    num_seeded_rows: int = 0
    # each row's noise key, [N] int64 each (``noise_keys``): the seeds for a counter-keyed draw
    # (``Sampler(race=...)``, set with a step seed), the counters whenever some random row is seeded or seeds are
    noise_seeds: torch.Tensor | None = None
    noise_counters: torch.Tensor | None = None
    # Applied in order to the logits before temperature; only those some row uses this step.
    processors: list[LogitsProcessor] = field(default_factory=list)

    @property
    def needs_sync(self) -> bool:
        """Some processor reads every earlier token, so a pending one must land first (overlap)."""
        return any(p.needs_sync for p in self.processors)

    @property
    def is_plain_greedy(self) -> bool:
        """All rows greedy with nothing to adjust or report: the sampler just takes argmax."""
        return self.all_greedy and not self.processors and self.max_num_logprobs is None


def is_plain_greedy_row(row: SamplingRow) -> bool:
    """Greedy with nothing to adjust or report: a batch of only such rows is ``is_plain_greedy``, known
    without building it."""
    return row.params.greedy and row.params.logprobs is None and not adjusts_row(row)


def noise_keys(rows: Sequence[SamplingRow], step_seed: int) -> tuple[list[int], list[int]]:
    """Each row's (seed, counter) for a counter-keyed draw: a seeded row's own seed and its output count, so its
    noise is the same whatever its batch; an unseeded row's seed ``step_seed`` + its row (``step_seed`` drawn
    afresh each step, below 2^62)."""
    seeds = [row.seed if row.seed is not None else step_seed + i for i, row in enumerate(rows)]
    return seeds, [row.num_output_tokens for row in rows]


def build_sampling_batch(
    rows: Sequence[SamplingRow],
    generators: Sequence[torch.Generator | None],
    vocab_size: int,
    device: torch.device | str,
    noise_step_seed: int | None = None,
    output_counts: Sequence[int] | np.ndarray | None = None,
) -> SamplingBatch:
    """Pack per-row settings into tensors on ``device``.

    ``generators[i]`` is row ``i``'s own RNG or ``None`` for the default RNG; with ``noise_step_seed`` the
    batch carries each row's noise key instead (``noise_keys``), for a sampler that draws by counter. Seeded
    random rows' counters are carried either way (the top-k candidates' hashed noise reads them);
    ``output_counts``: see ``with_noise_keys``.
    """
    num_rows = len(rows)
    if len(generators) != num_rows:
        raise ValueError(f"generators has {len(generators)} rows but there are {num_rows} sampling rows.")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}.")

    params = [r.params for r in rows]
    greedy = [p.greedy for p in params]
    all_greedy = all(greedy)
    num_logprobs = [p.logprobs for p in params]
    wanted = [n for n in num_logprobs if n is not None]

    def floats(values: list[float]) -> torch.Tensor:
        return to_device(values, torch.float32, device)

    greedy_mask = temperature = top_k = top_p = min_p = max_top_k = candidate_k = seeded = seed_keys = None
    candidate_rows: list[int] = []
    ks: list[int] = []
    seeded_rows: list[bool] = []
    if not all_greedy:
        temperature = floats([1.0 if g else p.temperature for p, g in zip(params, greedy)])
        if any(greedy):
            greedy_mask = to_device(greedy, torch.bool, device)
        if any(p.top_k != -1 and p.top_k < vocab_size for p in params):
            ks = [vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params]
            top_k, max_top_k = to_device(ks, torch.int64, device), max(ks)
            candidate_rows = [i for i, (k, g) in enumerate(zip(ks, greedy)) if not g and k < vocab_size]
            candidate_k = max((ks[i] for i in candidate_rows), default=None)
        if any(p.top_p < 1.0 for p in params):
            top_p = floats([p.top_p for p in params])
        if any(p.min_p > 0.0 for p in params):
            min_p = floats([p.min_p for p in params])
        seeded_rows = [r.seed is not None and not g for r, g in zip(rows, greedy)]
        if any(seeded_rows):
            seeded = to_device(seeded_rows, torch.bool, device)
            seed_keys = to_device([fold_seed(r.seed) if s else 0 for r, s in zip(rows, seeded_rows)], torch.int64,
                                  device)

    batch = SamplingBatch(
        num_rows=num_rows,
        vocab_size=vocab_size,
        all_greedy=all_greedy,
        greedy_mask=greedy_mask,
        temperature=temperature,
        top_k=top_k,
        max_top_k=max_top_k,
        candidate_rows=candidate_rows,
        candidate_k=candidate_k,
        top_k_list=ks,
        num_greedy_rows=sum(greedy),
        seeded=seeded,
        seed_keys=seed_keys,
        num_seeded_rows=sum(seeded_rows),
        top_p=top_p,
        min_p=min_p,
        generators={i: g for i, g in enumerate(generators) if g is not None and not greedy[i]},
        num_logprobs=num_logprobs,
        max_num_logprobs=max(wanted) if wanted else None,
        processors=build_logits_processors(rows, vocab_size, device),
    )
    if not all_greedy and (noise_step_seed is not None or seeded is not None):
        batch = with_noise_keys(batch, rows, noise_step_seed, output_counts)
    return batch


def with_noise_keys(batch: SamplingBatch, rows: Sequence[SamplingRow], step_seed: int | None,
                    output_counts: Sequence[int] | np.ndarray | None = None) -> SamplingBatch:
    """The batch with this step's noise keys (``noise_keys``): seeds only with ``step_seed``, counters always.
    ``output_counts``: each row's output count where its row's is out of date (a kept decode row)."""
    device = batch.temperature.device
    if output_counts is None:
        output_counts = [row.num_output_tokens for row in rows]
    seeds = None if step_seed is None else to_device(noise_keys(rows, step_seed)[0], torch.int64, device)
    return replace(batch, noise_seeds=seeds, noise_counters=to_device(output_counts, torch.int64, device))
