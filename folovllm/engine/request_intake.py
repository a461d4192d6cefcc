"""From a prompt and its parameters to a request group's validated samples, touching no engine state:
tokenize, truncate, check lengths, ids and logprobs, apply pooling, and build one ``Request`` per sample."""
from __future__ import annotations

import time
from dataclasses import dataclass

from folovllm.engine.output_processor import RequestGroup
from folovllm.engine.pooling import RequestParams, pooling_request
from folovllm.engine.prompt_checks import check_logprobs, check_prompt_length, check_request_ids, truncate_prompt
from folovllm.lora.request import LoRARequest
from folovllm.request import Request

PromptInput = str | list[int] | dict


@dataclass(frozen=True)
class ModelLimits:
    """What a request is checked against: the model's and the engine's limits."""

    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    hidden_size: int
    max_logprobs: int
    pooler_config: object | None  # runner="pooling": the model's pooling; None: it generates
    cross_encoder: bool


class RequestIntake:
    def __init__(self, tokenizer, limits: ModelLimits) -> None:
        self.tokenizer = tokenizer
        self.limits = limits

    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        """A prompt's text (if it has one) and token ids."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a dict prompt needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt) if prompt else []
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError(f"a prompt must be a string, a list of token ids or a dict; got {type(prompt).__name__}")

    def build(self, prompt: PromptInput, params: RequestParams, request_id: str, arrival_time: float | None,
              cache_salt: str | None, priority: int, user: str | None,
              lora_request: LoRARequest | None) -> RequestGroup:
        """The request's samples (``params.n`` of them); a ValueError says what is wrong with the input."""
        limits = self.limits
        if isinstance(prompt, dict) and prompt.get("cache_salt") is not None:
            cache_salt = prompt["cache_salt"]
        pooling, params = pooling_request(params, limits.pooler_config, limits.hidden_size, limits.cross_encoder)
        prompt_text, prompt_ids = self.tokenize(prompt)
        prompt_ids = truncate_prompt(prompt_ids, params.truncate_prompt_tokens, limits.max_model_len)
        check_prompt_length(len(prompt_ids), limits.max_model_len)
        bad_words = check_request_ids(prompt_ids, params, limits.vocab_size, self.tokenizer)
        check_logprobs(params, limits.max_logprobs)
        room = limits.max_model_len - len(prompt_ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        samples = [
            Request(request_id if params.n == 1 else f"{request_id}-{index}", prompt_ids, params, arrival,
                    max_tokens, limits.eos_token_ids, index, parent_id=request_id, cache_salt=cache_salt,
                    priority=priority, user=user, bad_words_token_ids=bad_words, pooling=pooling,
                    lora_request=lora_request)
            for index in range(params.n)]
        return RequestGroup(request_id, prompt_text, prompt_ids, samples)
