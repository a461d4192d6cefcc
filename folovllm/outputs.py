"""What the engine hands back to callers, with vLLM's names."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


# One dict per generated position: token id -> Logprob (the sampled token plus the top-N).
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt position: None for the first token (nothing predicts it), then as above.
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" (engine fault)
    # the stop token id or stop string that ended it; with "error", why (when known)
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)  # one small object per request, written every step
class RequestMetrics:
    """Wall-clock times (time.perf_counter) of a request's milestones."""

    arrival_time: float  # the caller's (the server's: before tokenizing)
    queued_time: float | None = None  # the engine queued it (past validation)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    # SamplingParams.prompt_logprobs set: aligned with prompt_token_ids, in every output of the request.
    prompt_logprobs: PromptLogprobs | None = field(default=None)
    # PD disaggregation: a producer's params for the consumer (set once the request finished)
    kv_transfer_params: dict[str, Any] | None = None
    num_external_computed_tokens: int = 0  # prompt tokens whose KV came from another instance
    # a pooling request's result once finished: one vector, or one per prompt token (pooling type ALL)
    pooled: list | None = None


@dataclass
class PoolingOutput:
    """A pooling request's raw result: a [hidden] vector, or [num_tokens, hidden] for pooling type ALL."""

    data: Any  # torch.Tensor (float32)


@dataclass
class PoolingRequestOutput:
    """``LLM.encode``'s output per prompt (vLLM's shape)."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """``LLM.embed``'s output per prompt (vLLM's shape): ``.outputs.embedding``."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """``LLM.score``'s output per pair (vLLM's shape): ``.outputs.score``; the prompt ids are both texts'."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True
