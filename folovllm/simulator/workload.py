"""The requests a simulation feeds its engines: ``bench serve``'s own generators (same options, same
seed, same lengths and arrivals), with prompts kept as runs of token ids until a request arrives.

A synthetic prompt is ``((token_id, count), ...)``: each ``make`` is one run of a fresh id, so distinct
prompts never share a KV block and a shared prefix shares exactly its own blocks (prefix caching sees
what it would see with random ids), at a fraction of the memory and time of 100,000 id lists.
"""
from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import numpy as np

from folovllm.bench import datasets as ds
from folovllm.bench.arrivals import arrival_offsets
from folovllm.bench.serve_workload import build_workload_requests

Runs = tuple[tuple[int, int], ...]


class RunPromptMaker(ds.PromptMaker):
    """Prompts as runs of one fresh id each; draws from ``rng`` as the token-id maker does, so the
    lengths that follow (and so the whole dataset) match ``bench serve``'s for the same seed."""

    def __init__(self, rng: np.random.Generator, token_id_range: tuple[int, int] = ds.DEFAULT_TOKEN_ID_RANGE) -> None:
        super().__init__("ids", rng, token_id_range)
        self._ids = itertools.count(1 << 24)  # clear of every vocabulary's ids, so no jsonl prompt matches

    def make(self, length: int) -> Runs:  # type: ignore[override]
        self.rng.integers(*self.token_id_range, size=length)  # the draw bench serve makes for these ids
        return ((next(self._ids), length),)

    def join(self, prefix: Runs, suffix: Runs) -> Runs:  # type: ignore[override]
        return prefix + suffix


@dataclass
class SimRequest:
    """One request of a simulated run."""

    index: int
    arrival_s: float
    prompt: Runs | list[int]
    prompt_len: int
    output_len: int  # max_tokens: the request generates exactly this many (ignore_eos), length permitting
    tag: str = ""
    priority: int = 0
    user: str | None = None

    def prompt_token_ids(self) -> list[int]:
        if isinstance(self.prompt, list):
            return self.prompt
        ids: list[int] = []
        for token, count in self.prompt:
            ids += [token] * count
        return ids


def _prompt_of(req: ds.ServeRequest, fresh: RunPromptMaker) -> Runs | list[int]:
    if isinstance(req.prompt, (tuple, list)):
        return req.prompt
    return fresh.make(req.prompt_len)  # text or messages: a fresh run of the counted length


def build_sim_requests(args: argparse.Namespace, max_model_len: int | None) -> list[SimRequest]:
    """``bench serve``'s requests and arrivals for the same options (``--dataset``, lengths, ``--request-rate``,
    ``--burstiness``, ``--seed``), sorted by arrival."""
    maker = RunPromptMaker(np.random.default_rng(args.seed), ds.parse_len_range(args.token_id_range, "--token-id-range"))
    served = build_workload_requests(args, max_model_len, "completions", maker=maker)
    fixed = args.request_rate is None and all(r.arrival_s is not None for r in served)
    if fixed:
        arrivals = [float(r.arrival_s) for r in served]  # type: ignore[arg-type]
    else:
        rate = ds.default_request_rate(args.dataset) if args.request_rate is None else args.request_rate
        arrivals = arrival_offsets(len(served), rate, args.burstiness, args.seed)
    fresh = RunPromptMaker(np.random.default_rng(args.seed + 1))
    requests = [SimRequest(i, t, _prompt_of(r, fresh), r.prompt_len, r.max_tokens, r.tag)
                for i, (r, t) in enumerate(zip(served, arrivals))]
    requests.sort(key=lambda r: (r.arrival_s, r.index))
    return requests
