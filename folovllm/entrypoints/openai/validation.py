"""From a parsed request body to engine inputs: every field checked before the engine sees it.

Plain functions without I/O: the server runs them on its tokenizer thread (tokenizing and rendering
chat templates never stall the event loop), and the property tests call them directly. Anything
wrong raises APIError with a 4xx status; ranges of sampling settings are SamplingParams' (shared
with the offline API), vocabulary bounds the engine's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from folovllm.engine.prompt_checks import check_prompt_length, truncate_prompt
from folovllm.entrypoints.openai.chat_template import RESERVED_TEMPLATE_KWARGS, render_chat_text
from folovllm.entrypoints.openai.errors import bad_request
from folovllm.entrypoints.openai.protocol import CompletionRequest, SamplingRequest, UnsupportedField
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest, ChatMessage
from folovllm.entrypoints.openai.reasoning import get_reasoning_parser
from folovllm.entrypoints.openai.structured import structured_outputs_from_body
from folovllm.entrypoints.openai.tool_parsers import get_tool_parser
from folovllm.entrypoints.openai.tool_parsers.forced import named_tool_schema, required_tools_schema
from folovllm.sampling_params import SamplingParams, StructuredOutputsParams


@dataclass(frozen=True)
class RequestLimits:
    """How much work one request may ask for; each bound has a `folovllm serve` flag."""

    max_request_body_bytes: int = 2**20  # parsed on the event loop: about 20 ms at this size
    max_prompts_per_request: int = 128
    max_n: int = 128
    max_stop_strings: int = 64  # also bounds stop_token_ids and bad_words
    max_stop_string_chars: int = 1000  # also bounds each bad word

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


@dataclass(frozen=True)
class ChatSettings:
    """How chat requests are rendered and their replies read; each field has a `folovllm serve` flag."""

    chat_template: str | None = None  # the template text, over the tokenizer's
    trust_request_chat_template: bool = False  # a request's own chat_template is refused without it
    tool_call_parser: str | None = None  # reads tool calls for tool_choice "auto"
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None:
            get_tool_parser(self.tool_call_parser)
        if self.reasoning_parser is not None:
            get_reasoning_parser(self.reasoning_parser)
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME (how to read the "
                             "model's tool calls)")


@dataclass
class Validator:
    """What validation needs to know about the served model."""

    tokenizer: object
    max_model_len: int
    limits: RequestLimits
    chat_settings: ChatSettings = field(default_factory=ChatSettings)
    # SamplingParams fields set by the model's generation config: used where a request omits them
    default_sampling: dict = field(default_factory=dict)
    kv_role: str | None = None  # the engine's --kv-role: kv_transfer_params are accepted only with one

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
        if body.kv_transfer_params is not None and len(prompts) > 1:
            raise bad_request("kv_transfer_params works with one prompt per request; got "
                              f"{len(prompts)}", "kv_transfer_params")
        if len(prompts) * body.n > most:
            raise bad_request(f"{len(prompts)} prompts with n={body.n} ask for {len(prompts) * body.n} "
                              f"sequences; at most {most} are allowed per request", "n")
        inputs = []
        for prompt in prompts:
            if isinstance(prompt, str):
                ids = self.encode(prompt, body.add_special_tokens, "prompt")
                kept = self._truncate(ids, params)
                # a truncated text is echoed as the tokens the model saw
                inputs.append({"prompt": prompt, "prompt_token_ids": ids} if kept is ids
                              else {"prompt_token_ids": kept})
            else:
                inputs.append({"prompt_token_ids": self._truncate(list(prompt), params)})
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
        self._tools(body, params)
        ids = self._truncate(self.chat_prompt_ids(body), params)
        self._check_length(len(ids), params, "messages", max_name)
        prompt = {"prompt_token_ids": ids}
        if body.cache_salt is not None:
            prompt["cache_salt"] = body.cache_salt
        return prompt, params, renames

    def chat_prompt_ids(self, body: ChatCompletionRequest) -> list[int]:
        """The conversation a chat body renders (with the tools its template is shown), as token ids:
        the prompt it would run on, before truncation and without its sampling and tool_choice checks."""
        return self.render_chat(body.messages, body.add_generation_prompt, body.add_special_tokens,
                                tools=self._rendered_tools(body), documents=body.documents,
                                chat_template=self._request_template(body), template_kwargs=body.chat_template_kwargs,
                                continue_final_message=body.continue_final_message)

    def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                    add_special_tokens: bool = False, *, tools: list[dict] | None = None,
                    documents: list[dict] | None = None, chat_template: str | None = None,
                    template_kwargs: dict[str, Any] | None = None,
                    continue_final_message: bool = False) -> list[int]:
        """The conversation through the chat template (the request's, the server's, else the
        tokenizer's), as token ids."""
        template = chat_template or self.chat_settings.chat_template
        if template is None and not getattr(self.tokenizer, "chat_template", None):
            raise bad_request("this model has no chat template; use /v1/completions, or start the "
                              "server with --chat-template", "messages")
        if continue_final_message and add_generation_prompt:
            raise bad_request("continue_final_message and add_generation_prompt cannot both be true: "
                              "set add_generation_prompt to false to continue the last message",
                              "continue_final_message")
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs or ()))
        if reserved:
            raise bad_request(f"chat_template_kwargs must not set {', '.join(reserved)}: these are "
                              "request fields of their own", "chat_template_kwargs")
        conversation = [m.to_template_dict() for m in messages]
        try:
            text = render_chat_text(self.tokenizer, conversation, chat_template=template, tools=tools,
                                    documents=documents, add_generation_prompt=add_generation_prompt,
                                    continue_final_message=continue_final_message,
                                    template_kwargs=template_kwargs)
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

    # -- chat options ---------------------------------------------------------------------------

    def _tools(self, body: ChatCompletionRequest, params: SamplingParams) -> None:
        """Checks tools and tool_choice; a required or named choice constrains ``params`` to the
        calls it asks for."""
        if body.tool_choice not in (None, "none") and body.tools is None:
            raise bad_request("tool_choice needs tools: give the tools the model may call, or leave "
                              "tool_choice out", "tool_choice")
        tools = body.tools or []
        names = [tool.function.name for tool in tools]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise bad_request(f"tools define {', '.join(twice)} more than once; each tool needs its own "
                              "name", "tools")
        mode, named = body.tool_mode
        settings = self.chat_settings
        if mode == "auto" and not settings.enable_auto_tool_choice:
            raise bad_request('tool_choice "auto" needs the server started with --enable-auto-tool-choice '
                              'and --tool-call-parser NAME; use tool_choice "required", a named tool, or '
                              '"none"' + ("" if body.tool_choice else ' (tools without tool_choice mean "auto")'),
                              "tool_choice")
        if mode == "named" and named not in names:
            raise bad_request(f"tool_choice names {named!r}, which is not among the tools ({', '.join(names)})",
                              "tool_choice")
        if mode in ("required", "named"):
            if params.structured_outputs is not None:
                raise bad_request(f'tool_choice "{body.tool_choice if mode == "required" else named}" '
                                  "constrains the output itself; it cannot be combined with "
                                  "structured outputs (response_format)", "tool_choice")
            try:
                schema = (named_tool_schema(tools[names.index(named)].function.parameters) if mode == "named"
                          else required_tools_schema([tool.function.model_dump() for tool in tools],
                                                     parallel=body.parallel_tool_calls is not False))
            except ValueError as err:
                raise bad_request(err, "tools") from err
            params.structured_outputs = StructuredOutputsParams(json=schema)

    def _rendered_tools(self, body: ChatCompletionRequest) -> list[dict] | None:
        """The tools the chat template is shown."""
        if not body.tools or (body.tool_mode[0] == "none" and self.chat_settings.exclude_tools_when_tool_choice_none):
            return None
        return [tool.model_dump(exclude_none=True) for tool in body.tools]

    def _request_template(self, body: ChatCompletionRequest) -> str | None:
        if body.chat_template is not None and not self.chat_settings.trust_request_chat_template:
            raise bad_request("this server does not run chat templates sent with a request (start it "
                              "with --trust-request-chat-template to allow them); leave chat_template out",
                              "chat_template")
        return body.chat_template

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
        if body.kv_transfer_params is not None and self.kv_role is None:
            raise bad_request("kv_transfer_params needs a server started with --kv-role (producer, consumer "
                              "or both) for prefill/decode disaggregation; leave it out", "kv_transfer_params")
        if len(body.stop_token_ids or ()) > limits.max_stop_strings:
            raise bad_request(f"stop_token_ids holds {len(body.stop_token_ids)} ids; at most "
                              f"{limits.max_stop_strings} are allowed", "stop_token_ids")
        bad_words = body.bad_words or []
        if len(bad_words) > limits.max_stop_strings:
            raise bad_request(f"bad_words holds {len(bad_words)} words; at most {limits.max_stop_strings} "
                              "are allowed", "bad_words")
        if any(len(w) > limits.max_stop_string_chars for w in bad_words):
            raise bad_request(f"each bad word must be at most {limits.max_stop_string_chars} characters",
                              "bad_words")

    def _params(self, body: SamplingRequest, max_tokens: int | None, logprobs: int | None,
                renames: dict[str, str] | None, prompt_logprobs: int | None = None) -> SamplingParams:
        top_k = -1 if body.top_k in (None, 0) else body.top_k
        # the model's generation config fills what the request leaves out
        given = body.model_fields_set
        sampling = {"temperature": body.temperature, "top_p": body.top_p, "top_k": top_k, "min_p": body.min_p,
                    "repetition_penalty": body.repetition_penalty}
        sampling.update({k: v for k, v in self.default_sampling.items() if k in sampling and k not in given})
        if max_tokens is None:
            max_tokens = self.default_sampling.get("max_tokens")
        try:
            logit_bias = body.logit_bias_by_id()
        except ValueError as err:
            raise bad_request(err, "logit_bias") from err
        structured = structured_outputs_from_body(body)
        try:
            return SamplingParams(
                n=body.n, seed=body.seed, stop=body.stop_list, stop_token_ids=body.stop_token_ids,
                max_tokens=max_tokens, min_tokens=body.min_tokens, ignore_eos=body.ignore_eos,
                logprobs=logprobs, prompt_logprobs=prompt_logprobs, presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty, skip_special_tokens=body.skip_special_tokens,
                include_stop_str_in_output=body.include_stop_str_in_output, logit_bias=logit_bias,
                allowed_token_ids=body.allowed_token_ids, bad_words=body.bad_words,
                truncate_prompt_tokens=body.truncate_prompt_tokens,
                structured_outputs=structured[0] if structured is not None else None,
                extra_args={"kv_transfer_params": body.kv_transfer_params} if body.kv_transfer_params else None,
                **sampling)
        except ValueError as err:
            raise bad_request(err, renames=renames) from err

    def _truncate(self, ids: list[int], params: SamplingParams) -> list[int]:
        """The prompt ids the engine will see (``truncate_prompt_tokens``); ``ids`` itself if whole."""
        try:
            kept = truncate_prompt(ids, params.truncate_prompt_tokens, self.max_model_len)
        except ValueError as err:
            raise bad_request(err, "truncate_prompt_tokens") from err
        return ids if len(kept) == len(ids) else kept

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

