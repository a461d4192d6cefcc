"""One generation sequence as the scheduler sees it: tokens so far and how many are computed."""
from __future__ import annotations

import enum
from typing import Any

from folovllm.lora.request import LoRARequest
from folovllm.outputs import PromptLogprobs, RequestMetrics, SampleLogprobs
from folovllm.pooling.pooler import PoolingRow
from folovllm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, its KV cache dropped (recompute)
    # blocks allocated, its prompt's KV on the way from another instance (kv_transfer); others run meanwhile
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # the engine failed on this request (a fault isolated to it)

    @property
    def finished(self) -> bool:
        return self in FINISHED_STATUSES


# what ``RequestStatus.finished`` tests, for loops over a whole batch that skip the property
FINISHED_STATUSES = frozenset((RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                               RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR))


def stop_token_ids(params: SamplingParams, eos_token_ids: list[int]) -> tuple[int, ...]:
    """The tokens that end a request once it has ``min_tokens`` outputs: its stop ids, and EOS
    unless ``ignore_eos``. Before ``min_tokens`` the sampler never picks them."""
    eos = () if params.ignore_eos else tuple(eos_token_ids)
    return tuple(params.stop_token_ids) + eos


def bad_words_token_ids(bad_words: list[str], tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """The token sequences that ``bad_words`` forbid (vLLM's rule): each word as it would start the
    text, plus with a leading space when that form starts with another token and has as many tokens."""
    sequences: list[tuple[int, ...]] = []
    for word in bad_words:
        word = word.lstrip()
        plain = tuple(tokenizer.encode(word, add_special_tokens=False)) if word else ()
        if not plain:
            raise ValueError(f"bad_words must be words that tokenize to at least one token, got {word!r}.")
        sequences.append(plain)
        spaced = tuple(tokenizer.encode(" " + word, add_special_tokens=False))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    return tuple(dict.fromkeys(sequences))


class Request:
    """A sequence being generated. ``n > 1`` requests become ``n`` of these (one per sample).

    The only progress counter is ``num_computed_tokens``: the tokens whose K/V are in the cache.
    Each step the scheduler gives the request some of its ``num_tokens - num_computed_tokens``
    uncomputed tokens; when it catches up to the end, the model samples the next token.
    """

    # slots: every step reads and writes a few fields of each running request; the ones each step touches first
    __slots__ = ("request_id", "num_computed_tokens", "num_pending_tokens", "token_ids", "output_token_ids",
                 "spec_token_ids", "max_tokens", "status", "plain_outputs", "grammar", "output_limit", "metrics",
                 "final_only", "parent_id", "detokenizer", "text", "stop_token_ids", "params", "lora_request",
                 "prompt_token_ids", "sample_index", "bad_words_token_ids", "seed", "num_cached_tokens", "priority",
                 "user", "arrival_seq", "admission_seq", "cache_salt", "block_hashes", "num_preemptions", "logprobs",
                 "cumulative_logprob", "prompt_logprobs", "num_prompt_logprobs", "stop_reason", "kv_transfer_params",
                 "kv_transfer_params_out", "num_external_computed_tokens", "pooling", "pooled")

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float, max_tokens: int, eos_token_ids: list[int], sample_index: int = 0,
                 parent_id: str | None = None, cache_salt: str | None = None,
                 priority: int = 0, user: str | None = None,
                 bad_words_token_ids: tuple[tuple[int, ...], ...] = (),
                 pooling: PoolingRow | None = None, lora_request: LoRARequest | None = None) -> None:
        self.request_id = request_id
        self.parent_id = parent_id or request_id
        self.sample_index = sample_index
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.max_tokens = max_tokens
        self.stop_token_ids = stop_token_ids(params, eos_token_ids)
        self.bad_words_token_ids = bad_words_token_ids  # SamplingParams.bad_words, tokenized
        # Sample i of a seeded request draws from its own RNG seeded with seed + i (kept by the worker).
        self.seed = None if params.seed is None else params.seed + sample_index
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt + output
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        # Overlap scheduling: tokens already sampled on the device by a step still in flight, not
        # yet in token_ids. They count in num_tokens, so the next step can be scheduled meanwhile.
        self.num_pending_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache
        # Speculative decoding: tokens proposed after the last one, verified by the next step (never cached)
        self.spec_token_ids: list[int] = []
        self.priority = priority  # lower runs first under the priority policy
        self.user = user  # the tenant, for the fair policy
        self.arrival_seq = 0  # set by the scheduler: tie-break among equal arrival times
        self.admission_seq = 0  # set by the scheduler each time the request starts running
        self.cache_salt = cache_salt  # requests with different salts never share cached blocks
        self.lora_request = lora_request  # the adapter it runs with (None: the base model)
        self.block_hashes: list[bytes] = []  # prefix-cache names of its full blocks, grown lazily
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.logprobs: SampleLogprobs | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        # Prompt logprobs are computed by a group's first sample only (the others would repeat them).
        # Indexed by prompt position, so a recomputed chunk (preemption) overwrites, never appends.
        self.prompt_logprobs: PromptLogprobs | None = None
        if params.prompt_logprobs is not None and sample_index == 0:
            self.prompt_logprobs = [None] * len(prompt_token_ids)
        self.num_prompt_logprobs = 0  # prompt positions 1.. that have their entry (filled in order)
        self.stop_reason: int | str | None = None
        self.detokenizer: Any = None  # set by the engine's output processor
        # Set by the output processor: outputs up to the length limit (max_tokens, or the model's length).
        self.output_limit = max_tokens
        # A sampled token needs no logprobs entry or stop-string search: the engine takes it in bulk.
        self.plain_outputs = params.logprobs is None and not params.stop
        self.final_only = params.output_kind == "final_only"  # its caller reads only the final output
        # Structured outputs: its grammar and matcher (structured_output.RequestGrammar), set by the engine.
        self.grammar: Any = None
        self.text = ""
        # PD disaggregation: the request's kv_transfer_params (SamplingParams.extra_args), a copy the
        # connector may mark as used; and the params its finish hands out (a producer's, for a consumer)
        extra = (params.extra_args or {}).get("kv_transfer_params")
        self.kv_transfer_params: dict[str, Any] | None = dict(extra) if extra else None
        self.kv_transfer_params_out: dict[str, Any] | None = None
        self.num_external_computed_tokens = 0  # prompt tokens whose KV came from another instance
        # A pooling request: prefill only, its prompt's hidden states pooled into ``pooled`` (no token is sampled).
        self.pooling = pooling
        self.pooled: list | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Some prompt token still lacks its logprob: the request must compute its whole prompt
        (no prefix-cache hits, whose tokens are never run through the model)."""
        return self.prompt_logprobs is not None and self.num_prompt_logprobs < self.num_prompt_tokens - 1

    @property
    def reads_every_prompt_row(self) -> bool:
        """Every prompt token must run through the model (no prefix-cache hits): prompt logprobs, or a
        pooling that reads rows before the last."""
        return self.needs_prompt_logprobs or (self.pooling is not None and self.pooling.pooling_type != "LAST")

    @property
    def is_ready(self) -> bool:
        """Everything it needs before it can run is there (its grammar has compiled)."""
        return self.grammar is None or self.grammar.ready

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + self.num_pending_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids) + self.num_pending_tokens

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None

    def append_output_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, {self.status.name})")
