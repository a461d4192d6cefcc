"""What a worker receives for one step and hands back: plain, picklable data, no tensors or RNGs.

This is the whole message a second rank (tensor parallelism) or a second instance (a KV
connector) would need; the engine's ``Request`` objects never cross it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from folovllm.lora.request import LoRARequest
from folovllm.pooling.pooler import PoolingRow
from folovllm.sample.prompt_logprobs import PromptLogprobsChunk, PromptLogprobsRequest
from folovllm.sample.rows import SamplingRow
from folovllm.sample.sampler import TokenLogprobs


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: new tokens at positions ``[num_computed_tokens, +num_new_tokens)``."""

    request_id: str
    new_token_ids: list[int]  # the new tokens the host knows, in position order
    # Tokens after those, sampled by the step still in flight: the worker feeds them from the device.
    num_pending_tokens: int
    num_computed_tokens: int  # position of the first new token (its K/V and all before are cached)
    block_table: list[int]  # KV block ids covering every position up to the last new token
    sampling: SamplingRow | None = None  # set when the last new token's logits give the next token
    # Set when the chunk's first rows predict prompt tokens whose logprobs the request asks for.
    prompt_logprobs: PromptLogprobsRequest | None = None
    pooling: PoolingRow | None = None  # a pooling request: its rows are pooled, nothing is sampled
    pooling_done: bool = False  # the chunk ends the pooling request's prompt: its result comes back
    lora: LoRARequest | None = None  # the adapter its rows run with (None: the base model)
    # Speculative decoding: the proposals ending ``new_token_ids``, verified by this step, and the
    # sampling settings of the row after each of them (``sampling`` is the row before the first)
    draft_token_ids: list[int] = field(default_factory=list)
    draft_rows: list[SamplingRow] = field(default_factory=list)
    # The worker keeps this request's block table, sampling row and adapter (worker/request_states.py): its
    # later steps of one token may come as decode rows. Set on rows whose sampling settings stay the same.
    keep: bool = False

    @property
    def num_new_tokens(self) -> int:
        return len(self.new_token_ids) + self.num_pending_tokens


@dataclass
class DecodeRows:
    """Requests the worker keeps (``ScheduledRequest.keep``) that each compute one token and sample the next, as
    columns: row ``i`` is request ``request_ids[i]`` at position ``positions[i]``."""

    request_ids: list[str]
    token_ids: list[int]  # each row's input token (0 where it is pending)
    positions: list[int]  # each row's position: its num_computed_tokens
    pending_rows: list[int] = field(default_factory=list)  # rows whose token the step in flight samples (overlap)
    # request id -> (index in its block table, the blocks from there on) for the tables that grew
    new_blocks: dict[str, tuple[int, list[int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.request_ids)


@dataclass
class StepInput:
    """One step: the scheduled requests in batch order, and the requests that ended since the last step."""

    requests: list[ScheduledRequest]
    # Applied first: the worker drops their per-request state (RNGs), so an id may be reused.
    finished_request_ids: list[str] = field(default_factory=list)
    decodes: DecodeRows | None = None  # rows after ``requests`` in the batch, from state the worker keeps


@dataclass
class StepOutput:
    """A step's sampled tokens, one row per request that sampled, in batch order."""

    request_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)  # None: the row did not ask
    prompt_logprobs: list[PromptLogprobsChunk] = field(default_factory=list)  # requests that asked
    wait_s: float = 0.0  # time the host spent blocked on the device for this result
    # (request id, pooled result) of the pooling requests whose prompt the step ended: a vector, or
    # for pooling type ALL one vector per prompt token
    pooled: list[tuple[str, list]] = field(default_factory=list)
    # a step that verified proposals: every row's emitted tokens (its kept proposals and one more) and
    # their logprobs; ``sampled_token_ids`` holds the first of each
    spec_token_ids: list[list[int]] = field(default_factory=list)
    spec_logprobs: list[list[TokenLogprobs | None]] = field(default_factory=list)

    def row_tokens(self, row: int) -> tuple[list[int], list[TokenLogprobs | None]]:
        """A sampling row's tokens in order (several when it verified proposals) and their logprobs."""
        if self.spec_token_ids:
            return self.spec_token_ids[row], self.spec_logprobs[row]
        return [self.sampled_token_ids[row]], [self.logprobs[row] if self.logprobs else None]
