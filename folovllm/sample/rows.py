"""One sampling row as plain data: what the sampler and the logits processors read about a sequence."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from folovllm.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingRow:
    """The settings of one sequence that samples a token this step. Picklable: no tensors, no RNG."""

    params: SamplingParams
    seed: int | None = None  # its own RNG's seed; the worker keeps that generator by request id
    num_output_tokens: int = 0  # sampled so far, including one still pending on the device
    stop_token_ids: Sequence[int] = ()  # tokens that end the request (banned before min_tokens)
    # Earlier tokens: sent only when a processor reads them (penalties, bad words), else empty.
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    bad_words_token_ids: Sequence[Sequence[int]] = ()  # token sequences it must not complete
    # Structured outputs: int32 words, bit t set = token t allowed next (None: unconstrained).
    allowed_token_bitmask: np.ndarray | None = None


def keeps_settings(row: SamplingRow) -> bool:
    """Whether the sequence's later rows equal this one but for the output count, which nothing reads once
    min_tokens is met: no grammar bitmask, bad words or penalties (they read the step's tokens)."""
    params = row.params
    return (row.allowed_token_bitmask is None and not row.bad_words_token_ids and not params.has_penalties
            and (row.num_output_tokens >= params.min_tokens or not row.stop_token_ids))
