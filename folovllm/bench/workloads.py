"""Seeded synthetic workloads: lists of (prompt_token_ids, max_tokens), scaled down from the GPU reference workloads for CPU."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class BenchRequest(NamedTuple):
    """One benchmark request; a plain tuple ``(prompt_token_ids, max_tokens)``."""

    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class WorkloadSpec:
    """Shape of a workload. ``min_output_len`` < ``output_len`` means max_tokens is uniform in that range."""

    num_requests: int
    input_len: int
    output_len: int
    min_output_len: int | None = None  # None: every request gets exactly output_len


# CPU-scale versions of the GPU reference workloads, which use 128 requests and 1024/512-token sides.
WORKLOADS: dict[str, WorkloadSpec] = {
    "decode-heavy": WorkloadSpec(num_requests=64, input_len=10, output_len=128),
    "prefill-heavy": WorkloadSpec(num_requests=16, input_len=512, output_len=16),
    "variable": WorkloadSpec(num_requests=64, input_len=10, output_len=256, min_output_len=16),
}


def special_token_ids(tokenizer: Any) -> set[int]:
    """Ids a synthetic prompt must not contain: the tokenizer's special and added tokens."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids.update(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return ids


def build_workload(
    name: str,
    vocab_size: int,
    special_ids: set[int] | frozenset[int] = frozenset(),
    *,
    num_requests: int | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """Build workload ``name`` with random prompt ids in ``[0, vocab_size)`` minus ``special_ids``.

    The overrides replace the spec's fields; for ``variable``, ``output_len`` is the upper end of the
    uniform max_tokens range (its lower end is ``min(16, output_len)``). Same arguments, same requests.
    """
    if name not in WORKLOADS:
        raise ValueError(f"Unknown workload {name!r}; choose one of {sorted(WORKLOADS)}.")
    spec = WORKLOADS[name]
    n = spec.num_requests if num_requests is None else num_requests
    in_len = spec.input_len if input_len is None else input_len
    out_hi = spec.output_len if output_len is None else output_len
    for field, value in (("num_requests", n), ("input_len", in_len), ("output_len", out_hi)):
        if value < 1:
            raise ValueError(f"{field} must be at least 1, got {value}.")
    allowed = np.setdiff1d(np.arange(vocab_size), np.fromiter(special_ids, dtype=np.int64))
    if allowed.size == 0:
        raise ValueError(f"No usable token ids: vocab_size={vocab_size} and all are special.")

    rng = np.random.default_rng(seed)
    prompts = rng.choice(allowed, size=(n, in_len), replace=True)
    if spec.min_output_len is None:
        max_tokens = np.full(n, out_hi)
    else:
        max_tokens = rng.integers(min(spec.min_output_len, out_hi), out_hi, size=n, endpoint=True)
    return [BenchRequest([int(t) for t in row], int(m)) for row, m in zip(prompts, max_tokens)]


def build_workload_for_tokenizer(tokenizer: Any, name: str, model_vocab_size: int | None = None,
                                 **overrides: Any) -> list[BenchRequest]:
    """``build_workload`` over a HF tokenizer's vocabulary (capped at the model's), minus special tokens."""
    vocab = len(tokenizer) if model_vocab_size is None else min(len(tokenizer), model_vocab_size)
    return build_workload(name, vocab, special_token_ids(tokenizer), **overrides)
