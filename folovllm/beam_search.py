"""Beam search as vLLM's offline API offers it: settings, results, and one expansion step.

Each step every live beam asks the engine for one token with the top ``2 * beam_width`` logprobs;
every (beam, candidate) pair becomes a new beam scored by its cumulative logprob, and the best
``beam_width`` go on. A candidate that is an EOS token ends its beam (unless ``ignore_eos``). At most
``beam_width`` candidates of one beam can survive, so the top ``2 * beam_width`` of each beam hold
every beam the full vocabulary would keep.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from folovllm.outputs import Logprob

MAX_BEAM_WIDTH = 10  # 2 * beam_width logprobs per step, and SamplingParams allows at most 20


@dataclass
class BeamSearchParams:
    """vLLM's beam-search settings."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.beam_width <= MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width must be in [1, {MAX_BEAM_WIDTH}] (each step asks for "
                             f"2 * beam_width logprobs); got {self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1; got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative; got {self.temperature}")


@dataclass
class BeamSearchSequence:
    """One beam: prompt and generated tokens, each generated token's logprobs, and its score parts."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (an EOS token) or "length"
    stop_reason: int | None = None  # the EOS token id that ended it


@dataclass
class BeamSearchOutput:
    """The best ``beam_width`` finished beams of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(beam: BeamSearchSequence, eos_token_ids: list[int], length_penalty: float) -> float:
    """Cumulative logprob over the sequence length (prompt included, a final EOS not) to the power
    ``length_penalty``: the order in which finished beams are ranked."""
    length = len(beam.tokens) - (1 if beam.tokens and beam.tokens[-1] in eos_token_ids else 0)
    return beam.cum_logprob / (max(length, 1) ** length_penalty)


def expand(beams: list[BeamSearchSequence], step_logprobs: list[dict[int, Logprob]],
           params: BeamSearchParams, eos_token_ids: list[int]
           ) -> tuple[list[BeamSearchSequence], list[BeamSearchSequence]]:
    """One step for one prompt: (the ``beam_width`` best live beams, the beams that ended on EOS)."""
    live, ended = [], []
    for beam, candidates in zip(beams, step_logprobs):
        for token_id, logprob in candidates.items():
            child = BeamSearchSequence(beam.tokens + [token_id], beam.logprobs + [candidates],
                                       beam.cum_logprob + logprob.logprob)
            if token_id in eos_token_ids and not params.ignore_eos:
                child.finish_reason, child.stop_reason = "stop", token_id
                ended.append(child)
            else:
                live.append(child)
    live.sort(key=lambda b: beam_score(b, eos_token_ids, params.length_penalty), reverse=True)
    return live[:params.beam_width], ended


def best_finished(finished: list[BeamSearchSequence], params: BeamSearchParams,
                  eos_token_ids: list[int]) -> list[BeamSearchSequence]:
    """The ``beam_width`` best of the finished beams, best first."""
    ranked = sorted(finished, key=lambda b: beam_score(b, eos_token_ids, params.length_penalty), reverse=True)
    return ranked[:params.beam_width]
