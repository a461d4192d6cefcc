"""From a parsed request body to engine inputs: every field checked before the engine sees it.

Plain functions without I/O: the server runs them on its tokenizer thread (tokenizing and rendering
chat templates never stall the event loop), and the property tests call them directly. Anything
wrong raises APIError with a 4xx status; ranges of sampling settings are SamplingParams' (shared
with the offline API), vocabulary bounds the engine's.
"""
from __future__ import annotations

from dataclasses import dataclass

from folovllm.engine.llm_engine import check_prompt_length
from folovllm.entrypoints.openai.errors import bad_request
from folovllm.entrypoints.openai.protocol import (ChatCompletionRequest, ChatMessage, CompletionRequest,
                                                  UnsupportedField, SamplingRequest)
from folovllm.entrypoints.openai.structured import structured_outputs_from_body
from folovllm.sampling_params import SamplingParams

@dataclass(frozen=True)
class RequestLimits:
    """How much work one request may ask for; each bound has a `folovllm serve` flag."""

    max_request_body_bytes: int = 2**20  # parsed on the event loop: about 20 ms at this size
    max_prompts_per_request: int = 128
    max_n: int = 128
    max_stop_strings: int = 64  # also bounds stop_token_ids
    max_stop_string_chars: int = 1000

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


@dataclass
class Validator:
    """What validation needs to know about the served model."""

    tokenizer: object
    max_model_len: int
    limits: RequestLimits

    def __post_init__(self) -> None:
        # No token is longer than this many characters, so a text longer than max_model_len times it
        # cannot fit, and is turned away before the tokenizer spends time on it.
        vocab = self.tokenizer.get_vocab()
        self.max_token_chars = max([len(t) for t in vocab] + [1])
        self.max_prompt_chars = self.max_model_len * self.max_token_chars

    # -- endpoints ------------------------------------------------------------------------------

    def completion(self, body: CompletionRequest) -> tuple[list[dict], SamplingParams]:
        """The engine prompts (tokenized) and sampling params of a /v1/completions body."""
        self._common(body)
        max_tokens = body.max_tokens
        if max_tokens == 0:  # scoring (echo, nothing generated): the engine runs one step
            if not body.echo:
                raise bad_request("max_tokens must be at least 1 (0 is allowed only with echo=true, "
                                  "to score the prompt)", "max_tokens")
            max_tokens = 1
        prompt_logprobs = body.prompt_logprobs
        if body.echo and body.logprobs is not None:  # the echoed prompt tokens carry logprobs too
            prompt_logprobs = max(prompt_logprobs or 0, body.logprobs)
        params = self._params(body, max_tokens, body.logprobs, renames=None, prompt_logprobs=prompt_logprobs)
        prompts = body.prompt
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise bad_request("prompt must not be empty", "prompt")
        limits = self.limits
        if len(prompts) > limits.max_prompts_per_request:
            raise bad_request(f"prompt holds {len(prompts)} prompts; at most "
                              f"{limits.max_prompts_per_request} are allowed per request", "prompt")
        most = max(limits.max_n, limits.max_prompts_per_request)
        if len(prompts) * body.n > most:
            raise bad_request(f"{len(prompts)} prompts with n={body.n} ask for {len(prompts) * body.n} "
                              f"sequences; at most {most} are allowed per request", "n")
        inputs = []
        for prompt in prompts:
            if isinstance(prompt, str):
                ids = self.encode(prompt, body.add_special_tokens, "prompt")
                inputs.append({"prompt": prompt, "prompt_token_ids": ids})
            else:
                inputs.append({"prompt_token_ids": list(prompt)})
            self._check_length(len(inputs[-1]["prompt_token_ids"]), params, "prompt", "max_tokens")
            if body.cache_salt is not None:
                inputs[-1]["cache_salt"] = body.cache_salt
        return inputs, params

    def chat(self, body: ChatCompletionRequest) -> tuple[dict, SamplingParams, dict[str, str]]:
        """The engine prompt, sampling params and the parameter renames (for engine errors)."""
        self._common(body)
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        renames = {"logprobs": "top_logprobs"}
        max_tokens, max_name = body.max_tokens, "max_tokens"
        if body.max_completion_tokens is not None:
            max_tokens, max_name = body.max_completion_tokens, "max_completion_tokens"
            renames["max_tokens"] = max_name
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        params = self._params(body, max_tokens, logprobs, renames, prompt_logprobs=body.prompt_logprobs)
        ids = self.render_chat(body.messages, body.add_generation_prompt, body.add_special_tokens)
        self._check_length(len(ids), params, "messages", max_name)
        prompt = {"prompt_token_ids": ids}
        if body.cache_salt is not None:
            prompt["cache_salt"] = body.cache_salt
        return prompt, params, renames

    def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                    add_special_tokens: bool = False) -> list[int]:
        """The conversation through the model's chat template, as token ids."""
        tokenizer = self.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise bad_request("this model has no chat template; use /v1/completions", "messages")
        conversation = [m.to_template_dict() for m in messages]
        try:
            text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt)
        except Exception as err:  # a template rejecting the conversation (e.g. role order)
            raise bad_request(f"the chat template rejected the messages: {err}", "messages") from err
        return self.encode(text, add_special_tokens, "messages")

    def encode(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        if len(text) > self.max_prompt_chars:
            raise bad_request(f"the {param} has {len(text)} characters, more than can fit in "
                              f"max_model_len={self.max_model_len} tokens", param)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, token_ids: list[int]) -> str:
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab for t in token_ids):
            raise bad_request(f"tokens must be ids in [0, {vocab})", "tokens")
        return self.tokenizer.decode(token_ids)

    # -- shared checks --------------------------------------------------------------------------

    def _common(self, body: SamplingRequest) -> None:
        try:
            body.check_supported()
        except UnsupportedField as err:
            raise bad_request(err, err.param) from err
        except ValueError as err:
            raise bad_request(err, "messages") from err
        limits = self.limits
        if body.n > limits.max_n:
            raise bad_request(f"n must be at most {limits.max_n} on this server, got {body.n}", "n")
        stop = body.stop_list
        if len(stop) > limits.max_stop_strings:
            raise bad_request(f"stop holds {len(stop)} strings; at most {limits.max_stop_strings} "
                              "are allowed", "stop")
        if any(len(s) > limits.max_stop_string_chars for s in stop):
            raise bad_request(f"each stop string must be at most {limits.max_stop_string_chars} "
                              "characters", "stop")
        if body.prompt_logprobs is not None and body.stream:
            raise bad_request("prompt_logprobs are not available when stream=true", "prompt_logprobs")
        if len(body.stop_token_ids or ()) > limits.max_stop_strings:
            raise bad_request(f"stop_token_ids holds {len(body.stop_token_ids)} ids; at most "
                              f"{limits.max_stop_strings} are allowed", "stop_token_ids")

    @staticmethod
    def _params(body: SamplingRequest, max_tokens: int | None, logprobs: int | None,
                renames: dict[str, str] | None, prompt_logprobs: int | None = None) -> SamplingParams:
        top_k = -1 if body.top_k in (None, 0) else body.top_k
        structured = structured_outputs_from_body(body)
        try:
            return SamplingParams(
                n=body.n, temperature=body.temperature, top_p=body.top_p, top_k=top_k, min_p=body.min_p,
                seed=body.seed, stop=body.stop_list, stop_token_ids=body.stop_token_ids,
                max_tokens=max_tokens, min_tokens=body.min_tokens, ignore_eos=body.ignore_eos,
                logprobs=logprobs, prompt_logprobs=prompt_logprobs, presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty, repetition_penalty=body.repetition_penalty,
                skip_special_tokens=body.skip_special_tokens,
                include_stop_str_in_output=body.include_stop_str_in_output,
                structured_outputs=structured[0] if structured is not None else None)
        except ValueError as err:
            raise bad_request(err, renames=renames) from err

    def _check_length(self, num_prompt_tokens: int, params: SamplingParams, prompt_param: str,
                      max_param: str) -> None:
        limit = self.max_model_len
        try:
            check_prompt_length(num_prompt_tokens, limit, prompt_param)
        except ValueError as err:
            raise bad_request(err, prompt_param) from err
        if params.max_tokens is not None and num_prompt_tokens + params.max_tokens > limit:
            raise bad_request(
                f"{max_param} is too large: this model's maximum context length is {limit} tokens, and "
                f"the {prompt_param} has {num_prompt_tokens}, so at most {limit - num_prompt_tokens} "
                f"can be generated; got {max_param}={params.max_tokens}", max_param)

