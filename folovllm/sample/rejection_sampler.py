"""Speculative decoding's verification: which proposed tokens a request keeps, and the token after them.

A request that proposed ``k`` tokens has ``k + 1`` logits rows: row ``j`` scores the token after the
first ``j`` proposals. Greedy rows keep proposals while they equal the target's argmax. Random rows
use rejection sampling, which leaves the emitted tokens distributed exactly as the target samples
them one at a time: proposal ``d`` (drawn from ``q``; a one-hot ``q`` for n-gram lookup) is kept with
probability ``min(1, p(d) / q(d))``; the first rejected one is replaced by a draw from
``max(p - q, 0)`` renormalized; when all are kept a bonus token is drawn from the last row.
A seeded request draws every uniform and every sample from its own generator, so it stays reproducible.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from folovllm.sample.metadata import SamplingBatch, build_sampling_batch
from folovllm.sample.rows import SamplingRow
from folovllm.sample.sampler import Sampler, TokenLogprobs, gather_logprobs


def accept_greedy(target: Sequence[int], drafts: Sequence[int]) -> list[int]:
    """The target's argmax tokens up to and including its first disagreement with ``drafts``
    (``len(drafts) + 1`` tokens when it agrees with every one)."""
    emitted = []
    for j, draft in enumerate(drafts):
        emitted.append(target[j])
        if target[j] != draft:
            return emitted
    emitted.append(target[len(drafts)])
    return emitted


def accept_sampled(probs: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None,
                   draft_probs: torch.Tensor | None = None) -> list[int]:
    """Rejection sampling over ``probs`` ``[k + 1, V]`` (the target's distributions) for ``k`` proposals;
    ``draft_probs`` ``[k, V]``: the proposer's distributions (None: each proposal was certain)."""
    k = len(drafts)
    num_accepted = k
    if k:
        ids = torch.tensor(drafts, device=probs.device)
        rows = torch.arange(k, device=probs.device)
        p = probs[rows, ids]
        q = torch.ones_like(p) if draft_probs is None else draft_probs[rows, ids]
        uniform = torch.rand(k, generator=generator, device=probs.device)
        rejected = (uniform * q >= p).tolist()  # u < p/q keeps the proposal
        num_accepted = rejected.index(True) if True in rejected else k
    if num_accepted < k:
        residual = probs[num_accepted].clone()
        if draft_probs is None:
            residual[drafts[num_accepted]] = 0.0
        else:
            residual = (residual - draft_probs[num_accepted]).clamp_(min=0.0)
        last = residual
    else:
        last = probs[k].clone()
    noise = torch.empty_like(last).exponential_(generator=generator)
    return list(drafts[:num_accepted]) + [int(last.div_(noise).argmax())]


def verify(logits: torch.Tensor, rows: Sequence[SamplingRow], drafts: Sequence[Sequence[int]],
           generators: Sequence[torch.Generator | None], sampler: Sampler
           ) -> tuple[list[list[int]], list[list[TokenLogprobs | None]]]:
    """Each request's emitted tokens (its kept proposals and one more) and their logprobs.

    ``logits``: ``[sum(k_i + 1), V]``, each request's rows in order; ``rows``: the sampling settings of
    each of those rows; ``drafts``: each request's proposals; ``generators``: each request's RNG."""
    batch = build_sampling_batch(rows, [None] * len(rows), logits.shape[1], logits.device)
    adjusted, raw_logprobs = sampler.adjusted(logits, batch)
    greedy_tokens = adjusted.argmax(dim=-1).tolist()
    probs = None if batch.all_greedy else sampler.probabilities(adjusted, batch)
    emitted: list[list[int]] = []
    start = 0
    for request_drafts, generator in zip(drafts, generators):
        end = start + len(request_drafts) + 1
        if rows[start].params.greedy:
            emitted.append(accept_greedy(greedy_tokens[start:end], request_drafts))
        else:
            emitted.append(accept_sampled(probs[start:end], request_drafts, generator))
        start = end
    return emitted, _logprobs(raw_logprobs, emitted, drafts, batch)


def _logprobs(raw_logprobs: torch.Tensor | None, emitted: list[list[int]], drafts: Sequence[Sequence[int]],
              batch: SamplingBatch) -> list[list[TokenLogprobs | None]]:
    """Each emitted token's logprobs from its own row (rows past a request's last token are unread)."""
    if raw_logprobs is None:
        return [[None] * len(tokens) for tokens in emitted]
    chosen: list[int] = []
    for tokens, request_drafts in zip(emitted, drafts):
        chosen.extend(tokens + [0] * (len(request_drafts) + 1 - len(tokens)))
    per_row = gather_logprobs(raw_logprobs, torch.tensor(chosen, device=raw_logprobs.device), chosen, batch)
    result, start = [], 0
    for tokens, request_drafts in zip(emitted, drafts):
        result.append(per_row[start:start + len(tokens)])
        start += len(request_drafts) + 1
    return result
