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
    """``num_requests`` prompts of ``input_len`` random ids (or of a length uniform in ``[input_min,
    input_len]`` when ``input_min`` is set), each asking for ``output_len`` tokens (a fixed count, or uniform
    in ``[output_min, output_len]`` when ``output_min`` is set)."""

    name: str
    num_requests: int
    input_len: int
    output_len: int
    seed: int
    metric: str
    output_min: int | None = None
    input_min: int | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {sorted(METRICS)}, got {self.metric!r}")
        if min(self.num_requests, self.input_len, self.output_len) < 1:
            raise ValueError(f"{self.name}: requests, input_len and output_len must be at least 1")
        if self.output_min is not None and not 1 <= self.output_min <= self.output_len:
            raise ValueError(f"{self.name}: output_min must lie in [1, output_len]")
        if self.input_min is not None and not 1 <= self.input_min <= self.input_len:
            raise ValueError(f"{self.name}: input_min must lie in [1, input_len]")

    @property
    def shape(self) -> str:
        """``64 × 10 × 128`` (requests × prompt tokens × output tokens; a range where lengths vary)."""
        prompt = self.input_len if self.input_min is None else f"{self.input_min}–{self.input_len}"
        out = self.output_len if self.output_min is None else f"{self.output_min}–{self.output_len}"
        return f"{self.num_requests} × {prompt} × {out}"

    @property
    def kind(self) -> str:
        """What the workload stresses: ``one_stream``, ``prefill`` (judged by input tok/s), ``variable``
        (lengths vary) or ``decode`` (batched)."""
        if self.num_requests == 1:
            return "one_stream"
        if self.metric == "input_tok_s":
            return "prefill"
        return "variable" if self.output_min is not None or self.input_min is not None else "decode"

    @property
    def longest(self) -> int:
        """The most tokens one of its sequences holds: prompt plus output."""
        return self.input_len + self.output_len


WARMUP = Workload("warmup", 4, 10, 16, seed=100, metric="output_tok_s")
WORKLOADS: tuple[Workload, ...] = (
    Workload("decode_heavy", 64, 10, 128, seed=1, metric="output_tok_s"),
    Workload("long_decode", 128, 10, 256, seed=2, metric="output_tok_s"),
    Workload("prefill_heavy", 16, 512, 16, seed=3, metric="input_tok_s"),
    Workload("variable", 64, 10, 256, seed=4, metric="output_tok_s", output_min=16),
    Workload("one_stream", 1, 10, 128, seed=5, metric="ms_per_output_token"),
)

# The sweep (compare.py --sweep): shapes the kernels were not tuned on (the table's decode rows are 64 and
# 128, its prefill 16 x 512), sized so that one round of both engines takes about ten minutes on 2 cores.
# Batched decode at 16-128 rows and 64-256 new tokens; prompts of 256-2,048 tokens, which our default
# budget (2,048 tokens a step) and vLLM's (4,096) chunk as each engine chooses; mixed prompt and output
# lengths; and one stream over a longer prompt.
SWEEP: tuple[Workload, ...] = (
    Workload("decode_16x256", 16, 10, 256, seed=21, metric="output_tok_s"),
    Workload("decode_32x64", 32, 10, 64, seed=22, metric="output_tok_s"),
    Workload("decode_48x192", 48, 128, 192, seed=23, metric="output_tok_s"),
    Workload("decode_96x128", 96, 10, 128, seed=24, metric="output_tok_s"),
    Workload("decode_128x64", 128, 32, 64, seed=25, metric="output_tok_s"),
    Workload("variable_96", 96, 10, 192, seed=26, metric="output_tok_s", output_min=32),
    Workload("variable_48_prompts", 48, 512, 256, seed=27, metric="output_tok_s", output_min=16, input_min=32),
    Workload("prefill_256", 32, 256, 16, seed=28, metric="input_tok_s"),
    Workload("prefill_1024", 16, 1024, 16, seed=29, metric="input_tok_s"),
    Workload("prefill_2048", 8, 2048, 16, seed=30, metric="input_tok_s"),
    Workload("one_stream_512", 1, 512, 128, seed=31, metric="ms_per_output_token"),
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
        length = workload.input_len if workload.input_min is None else rng.randint(workload.input_min,
                                                                                      workload.input_len)
        prompt = [rng.randrange(lo, hi) for _ in range(length)]
        max_tokens = (workload.output_len if workload.output_min is None
                      else rng.randint(workload.output_min, workload.output_len))
        requests.append({"prompt_token_ids": prompt, "max_tokens": max_tokens})
    return requests


def select(names: str | None, sweep: bool = False) -> tuple[Workload, ...]:
    """The workloads a comma-separated list names (all when ``None``), in the table's order; from the
    sweep's points with ``sweep``."""
    table = SWEEP if sweep else WORKLOADS
    if names is None:
        return table
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {w.name for w in table}
    unknown = sorted(set(wanted) - known)
    if unknown or not wanted:
        raise ValueError(f"unknown workload(s) {unknown or names!r}; choose from {', '.join(sorted(known))}")
    return tuple(w for w in table if w.name in wanted)
