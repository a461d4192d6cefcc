"""Turns one step's logits into next tokens: logits processors (penalties, min_tokens, ...),
temperature, top-k/top-p/min-p, sampling.

Rows are processed together; only rows with their own ``torch.Generator`` draw their noise
one at a time, so a seeded request gets the same tokens whatever else is in the batch. Where the platform
has a counter-keyed draw (``Platform.sampling_race``: CUDA's Triton kernel) every row's noise comes from its
(seed, output count) in one launch instead, which a CUDA graph replays as it is.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from folovllm.platforms import to_device
from folovllm.sample.metadata import SamplingBatch, SamplingRow, build_sampling_batch
from folovllm.sample.seeded_noise import seeded_exponential
from folovllm.sample.top_entries import top_entries

__all__ = [
    "Sampler",
    "SamplerOutput",
    "TokenLogprobs",
    "SamplingBatch",
    "SamplingRow",
    "build_sampling_batch",
]

# race(probs [N, V], seeds [N], counters [N]) -> tokens [N]: each row's argmax of probs / Exp(1) noise keyed by
# its (seed, counter)
Race = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# sample_top_k(logits, k, temperature, top_k, top_p, min_p, seed_keys, counters, seeded, noise) -> tokens: the
# candidate path below in one kernel (Platform.candidate_sampler)
CandidateKernel = Callable[..., torch.Tensor]


@dataclass
class TokenLogprobs:
    """Log-probabilities for one sampled token, from ``log_softmax`` of the raw logits."""

    token_id: int
    logprob: float
    rank: int  # 1 + number of tokens with a strictly higher logprob
    top_logprobs: list[tuple[int, float]]  # (token_id, logprob), highest first


@dataclass
class SamplerOutput:
    sampled_token_ids: list[int]
    logprobs: list[TokenLogprobs | None]  # None for rows that did not ask for logprobs


class Sampler:
    """Samples one token per logits row.

    Two shortcuts, checked by tests against the general path: plain argmax when every row is
    greedy with nothing to adjust, and ``topk`` instead of a full sort when no row uses top-p.
    ``race``: the platform's counter-keyed draw (its batches carry noise keys); None: the generators' draw.
    ``top_k_candidates`` (``FOLOVLLM_TOP_K_CANDIDATES``; only without a ``race``, which already keys each token's
    noise): a batch whose random rows all have a top_k samples each row among its top ``candidate_k`` tokens
    (``topk``: no sort, softmax or noise over the whole vocabulary); the same distribution, but a tie at a row's
    k-th logit keeps k tokens where the full path keeps every tied one. A seeded row's noise for token t at its
    n-th output token is a function of (seed, n, t) on both keyed draws (``race``: Philox; the candidates: a
    hash, sample/seeded_noise.py), so its tokens are the same whatever its batch; the full path on the CPU
    draws it from the request's generator instead. ``candidate_kernel``: the platform's form of the candidate
    path (None: its torch form).
    """

    def __init__(self, race: Race | None = None, top_k_candidates: bool = False,
                 candidate_kernel: CandidateKernel | None = None) -> None:
        self.race = race
        self.top_k_candidates = top_k_candidates and race is None
        self.candidate_kernel = candidate_kernel

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        return self.forward(logits, batch)

    def forward(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """``logits``: ``[N, V]``, one row per sequence sampling this step. Not modified."""
        sampled, logprobs = self.sample(logits, batch)
        return SamplerOutput(sampled.tolist(), logprobs)

    def sample(self, logits: torch.Tensor, batch: SamplingBatch
               ) -> tuple[torch.Tensor, list[TokenLogprobs | None]]:
        """The sampled ids as a device tensor ``[N]`` (no host sync unless logprobs are asked for,
        so the caller can overlap the next step's CPU work), plus each row's logprobs."""
        if logits.dim() != 2 or tuple(logits.shape) != (batch.num_rows, batch.vocab_size):
            raise ValueError(
                f"logits must be [num_rows={batch.num_rows}, vocab_size={batch.vocab_size}], "
                f"got {tuple(logits.shape)}."
            )
        no_logprobs: list[TokenLogprobs | None] = [None] * batch.num_rows
        if batch.is_plain_greedy:
            return logits.argmax(dim=-1), no_logprobs

        logits, raw_logprobs = self.adjusted(logits, batch)
        if batch.all_greedy:
            sampled = logits.argmax(dim=-1)
        else:
            sampled = self._sample(logits, batch)
        if raw_logprobs is None:
            return sampled, no_logprobs
        return sampled, gather_logprobs(raw_logprobs, sampled, sampled.tolist(), batch)

    @staticmethod
    def adjusted(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A float32 copy of the logits with the logits processors applied (greedy rows take its
        argmax), and the raw logits' log-softmax when some row asks for logprobs."""
        raw_logprobs = None
        if batch.max_num_logprobs is not None:
            raw_logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        logits = logits.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        for processor in batch.processors:
            processor.apply(logits)
        return logits, raw_logprobs

    @staticmethod
    def probabilities(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Each random row's distribution (temperature, top-k/top-p, min-p), in place on ``adjusted``'s
        logits; greedy rows are left at temperature 1 and should be read by their argmax instead."""
        logits.div_(batch.temperature.unsqueeze(1))  # set whenever some row is random
        if batch.top_p is not None:
            _apply_top_k_top_p(logits, batch.top_k, batch.top_p)
        elif batch.top_k is not None:
            _apply_top_k_only(logits, batch.top_k, batch.max_top_k)
        if batch.min_p is not None:
            _apply_min_p(logits, batch.min_p)
        return logits.softmax(dim=-1)

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        greedy_tokens = None
        if batch.greedy_mask is not None:
            greedy_tokens = logits.argmax(dim=-1)
        rows = batch.candidate_rows if self.top_k_candidates else []
        if rows and batch.seeded is not None and batch.noise_counters is None:
            raise ValueError("seeded rows sampled among their top k need their output counts (noise_counters)")
        if rows and len(rows) == batch.num_rows - batch.num_greedy_rows:  # every random row has a top k
            sampled = _sample_candidates(logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p,
                                         _Seeds.of(batch), batch.candidate_k, self.candidate_kernel)
        elif rows:
            sampled = self._sample_some_candidates(logits, batch, rows)
        else:
            probs = self.probabilities(logits, batch)
            if self.race is not None and batch.noise_seeds is not None:
                sampled = self.race(probs, batch.noise_seeds, batch.noise_counters)
            else:
                sampled = _exponential_race(probs, batch.generators)
        if greedy_tokens is not None:
            sampled = torch.where(batch.greedy_mask, greedy_tokens, sampled)
        return sampled

    def _sample_some_candidates(self, logits: torch.Tensor, batch: SamplingBatch, rows: list[int]) -> torch.Tensor:
        """The candidate rows among their top k, the others through the full path (which draws no noise from
        the candidate rows' generators: a seeded row's stream does not depend on its neighbours)."""
        index = to_device(rows, torch.int64, logits.device)

        def pick(values: torch.Tensor | None) -> torch.Tensor | None:
            return None if values is None else values[index]

        seeds = _Seeds.of(batch)
        chosen = _sample_candidates(logits[index], pick(batch.temperature), pick(batch.top_k), pick(batch.top_p),
                                    pick(batch.min_p), seeds.rows(index) if seeds else None, batch.candidate_k,
                                    self.candidate_kernel)
        candidates = set(rows)
        others = {row: g for row, g in batch.generators.items() if row not in candidates}
        sampled = _exponential_race(self.probabilities(logits, batch), others)
        sampled[index] = chosen
        return sampled


class _Seeds:
    """Candidate rows' seeds: which rows have one (``every``: all that are not greedy), their folded seeds,
    each row's output count."""

    def __init__(self, mask: torch.Tensor, keys: torch.Tensor, counters: torch.Tensor, every: bool) -> None:
        self.mask, self.keys, self.counters, self.every = mask, keys, counters, every

    @classmethod
    def of(cls, batch: SamplingBatch) -> _Seeds | None:
        if batch.seeded is None:
            return None
        every = batch.num_seeded_rows == batch.num_rows - batch.num_greedy_rows
        return cls(batch.seeded, batch.seed_keys, batch.noise_counters, every)

    def rows(self, index: torch.Tensor) -> _Seeds:
        return _Seeds(self.mask[index], self.keys[index], self.counters[index], False)


def _sample_candidates(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor | None, min_p: torch.Tensor | None, seeds: _Seeds | None,
                       candidate_k: int, kernel: CandidateKernel | None = None) -> torch.Tensor:
    """Rows that each sample among their top k logits: temperature, top-k, top-p and min-p on those alone (the
    full path's rules), then the race over them, a seeded row's noise hashed from its seed and output count.
    ``kernel``: the same in one call, given the noise this form would draw from the global generator."""
    if kernel is not None:
        # the noise this form draws for unseeded rows, from the global generator as it would
        noise = None if seeds is not None and seeds.every else \
            torch.empty(logits.shape[0], candidate_k, dtype=torch.float32, device=logits.device).exponential_()
        if seeds is None:
            return kernel(logits, candidate_k, temperature, top_k, top_p, min_p, None, None, None, noise)
        return kernel(logits, candidate_k, temperature, top_k, top_p, min_p, seeds.keys, seeds.counters,
                      None if seeds.every else seeds.mask, noise)
    values, token_ids = logits.topk(candidate_k, dim=-1)  # highest first
    values.div_(temperature.unsqueeze(1))
    columns = torch.arange(candidate_k, device=values.device)
    values.masked_fill_(columns >= top_k.unsqueeze(1), float("-inf"))
    if top_p is not None:
        # the full path's rule: drop the low tail whose mass (the token's own included) is at most 1 - p
        mass_up_to = values.softmax(dim=-1).flip(-1).cumsum(dim=-1).flip(-1)
        drop = mass_up_to <= (1.0 - top_p).unsqueeze(1)
        drop[:, 0] = False
        values.masked_fill_(drop, float("-inf"))
    if min_p is not None:
        _apply_min_p(values, min_p)
    probs = values.softmax(dim=-1)
    if seeds is None:
        noise = torch.empty_like(probs).exponential_()
    else:
        noise = seeded_exponential(seeds.keys, seeds.counters, token_ids)  # greedy rows' goes unread
        if not seeds.every:
            noise = torch.where(seeds.mask.unsqueeze(1), noise, torch.empty_like(probs).exponential_())
    choice = probs.div_(noise).argmax(dim=-1)
    return token_ids.gather(1, choice.unsqueeze(1)).squeeze(1)


def _apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> None:
    """One ascending sort serves both filters; top-p acts on the distribution left by top-k."""
    sorted_logits, sorted_ids = logits.sort(dim=-1)
    vocab_size = logits.shape[1]
    if top_k is not None:
        kth_largest = sorted_logits.gather(1, (vocab_size - top_k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth_largest, float("-inf"))
    if top_p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop the low tail whose total mass is at most 1 - p; always keep the top token.
        drop = cumulative <= (1.0 - top_p).unsqueeze(1)
        drop[:, -1] = False
        sorted_logits.masked_fill_(drop, float("-inf"))
    logits.scatter_(1, sorted_ids, sorted_logits)


def _apply_top_k_only(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int | None = None) -> None:
    """Top-k without a full sort: ``topk`` up to the largest k gives each row's threshold."""
    if max_top_k is None:  # reading it from the device waits for the device
        max_top_k = int(top_k.max())
    top_values = logits.topk(max_top_k, dim=-1).values
    kth_largest = top_values.gather(1, (top_k - 1).unsqueeze(1))
    logits.masked_fill_(logits < kth_largest, float("-inf"))


def _apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Drop tokens with prob < min_p * max prob, i.e. logit < max logit + log(min_p)."""
    threshold = logits.amax(dim=-1, keepdim=True) + min_p.log().unsqueeze(1)
    logits.masked_fill_(logits < threshold, float("-inf"))


def _exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample ``argmax(probs / q)`` with ``q ~ Exp(1)``: same law as ``multinomial(probs)``.

    A seeded row draws exactly V values from its own generator, so its tokens do not depend on
    the rest of the batch.
    """
    noise = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        noise.exponential_()
    for row, generator in generators.items():
        noise[row].exponential_(generator=generator)
    return probs.div_(noise).argmax(dim=-1)


def gather_logprobs(
    raw_logprobs: torch.Tensor, sampled: torch.Tensor, token_ids: list[int], batch: SamplingBatch
) -> list[TokenLogprobs | None]:
    # Computed for every row (cheaper than gathering the rows that asked, especially on CPU).
    chosen = raw_logprobs.gather(1, sampled.unsqueeze(1))
    ranks = (raw_logprobs > chosen).sum(dim=-1) + 1
    top_values, top_ids = top_entries(raw_logprobs, batch.max_num_logprobs)

    # One device-to-host copy per tensor, then plain Python.
    chosen_list = chosen.squeeze(1).tolist()
    ranks_list = ranks.tolist()
    top_values_list = top_values.tolist()
    top_ids_list = top_ids.tolist()

    return [
        None
        if n is None
        else TokenLogprobs(
            token_id=token_ids[row],
            logprob=chosen_list[row],
            rank=ranks_list[row],
            top_logprobs=list(zip(top_ids_list[row][:n], top_values_list[row][:n])),
        )
        for row, n in enumerate(batch.num_logprobs)
    ]
