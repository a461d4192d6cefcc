"""Request bodies of the OpenAI API (plus vLLM's sampling extras), as pydantic models.

Types are checked strictly here ("3" is not a number, NaN is not a temperature, text must be valid
Unicode); ranges are checked once, by SamplingParams, so the messages match the offline API's.
Responses are built as plain dicts in the serving modules (cheaper per streamed chunk).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

logger = logging.getLogger(__name__)

# Numbers must be finite; ints are not bools; a JSON int is a fine float.
Float = Annotated[float, Field(allow_inf_nan=False, strict=True)]
Int = StrictInt
Bool = StrictBool
TokenIds = list[StrictInt]


def _absent(value: Any) -> None:
    if value is not None:
        raise ValueError("this is a hosted model's setting, not implemented here; leave it out")
    return value


# A setting only a hosted model has (Anthropic's effort, OpenAI's verbosity): accepted only when absent.
HostedSetting = Annotated[str | None, AfterValidator(_absent)]

# Fields of the OpenAI API (or vLLM's extensions) that this server does not implement, each with the
# test for its no-op value: anything else is a 400 that names the field, never a silently different
# result. Unknown keys beyond these are ignored with a log line, as vLLM does.
_NOOP: dict[str, Callable[[Any], bool]] = {
    "best_of": lambda v: v in (None, 1),
    "suffix": lambda v: v in (None, ""),
    "use_beam_search": lambda v: v in (None, False),
    "length_penalty": lambda v: v in (None, 1, 1.0),
    "guided_whitespace_pattern": lambda v: v is None,
    "logits_processors": lambda v: v is None,
    "spaces_between_special_tokens": lambda v: v in (None, True),
    "prompt_embeds": lambda v: v is None,
    "mm_processor_kwargs": lambda v: v in (None, {}),
    "tools": lambda v: v in (None, []),  # chat implements these: on completions they are no-ops
    "tool_choice": lambda v: v in (None, "none"),
    "functions": lambda v: v in (None, []),
    "function_call": lambda v: v in (None, "none"),
    "audio": lambda v: v is None,
    "modalities": lambda v: v in (None, ["text"]),
    "prediction": lambda v: v is None,
    "reasoning_effort": lambda v: v is None,
    "verbosity": lambda v: v is None,
    "web_search_options": lambda v: v is None,
    "continue_final_message": lambda v: v in (None, False),
    "documents": lambda v: v is None,
    "chat_template": lambda v: v is None,
    "chat_template_kwargs": lambda v: v in (None, {}),
    "store": lambda v: v in (None, False),
    "echo": lambda v: v in (None, False),  # chat only: completions implement it
}
# Fields that only describe the request (no effect on what is generated): accepted as they are.
_METADATA = {"metadata", "service_tier", "prompt_cache_key", "safety_identifier", "request_id",
             "vllm_xargs"}


def _lone_surrogate_path(value: Any, path: str) -> str | None:
    """The path of the first string (or key) that is not valid Unicode (a lone UTF-16 surrogate,
    which JSON's \\ud800 escapes can carry), else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            found = _lone_surrogate_path(key, path) or _lone_surrogate_path(item, where)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate_path(item, f"{path}[{i}]")
            if found:
                return found
    return None


# What to use instead, for a field OpenAI deprecated in favour of one this server implements.
_REPLACEMENTS = {"functions": "tools", "function_call": "tool_choice"}


class UnsupportedField(ValueError):
    def __init__(self, name: str, value: Any) -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        instead = f"; use {_REPLACEMENTS[name]} instead" if name in _REPLACEMENTS else ""
        super().__init__(f"{name} is not supported by this server (got {shown}); leave it out{instead}")
        self.param = name


class _Body(BaseModel):
    """The checks every request body gets: valid Unicode, and no unimplemented field in use."""

    model_config = ConfigDict(extra="allow")
    _extra_noop: ClassVar[dict[str, Callable[[Any], bool]]] = {}  # an endpoint's own, beyond _NOOP
    _extra_metadata: ClassVar[frozenset[str]] = frozenset()  # an endpoint's own, beyond _METADATA

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        try:  # one pass in C; the walk that names the place runs only when something is wrong
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            path = _lone_surrogate_path(data, "")
            raise ValueError(f"{path} is not valid Unicode (it holds a lone UTF-16 surrogate)") from None
        except (TypeError, ValueError):
            pass  # not JSON data: the schema check that follows says what is wrong
        return data

    def check_supported(self) -> None:
        """Raises UnsupportedField for an unimplemented field set to something other than its no-op;
        logs unknown fields (ignored)."""
        ignored = []
        for name, value in (self.model_extra or {}).items():
            noop = _NOOP.get(name) or self._extra_noop.get(name)
            if noop is not None:
                if not noop(value) and not (name == "best_of" and value == getattr(self, "n", None)):
                    raise UnsupportedField(name, value)
            elif name not in _METADATA and name not in self._extra_metadata:
                ignored.append(name)
        if ignored:
            logger.warning("ignoring unknown request fields: %s", ", ".join(sorted(ignored)))


class StreamOptions(BaseModel):
    include_usage: Bool = False
    continuous_usage_stats: Bool = False  # vLLM's: with include_usage, usage so far on every chunk


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's named schema (``strict`` is always honoured)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(default="response", max_length=256)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: Bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: text, any JSON object, a JSON schema, or (vLLM) a structural tag whose
    ``structures`` and ``triggers`` sit beside ``type``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None

    @classmethod
    def of_schema(cls, schema: dict[str, Any], name: str = "response", strict: bool | None = None) -> ResponseFormat:
        return cls(type="json_schema", json_schema=JsonSchemaFormat(name=name, schema=schema, strict=strict))


class StructuredOutputsRequest(BaseModel):
    """vLLM's ``structured_outputs`` object: exactly one constraint (checked by StructuredOutputsParams)."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: Bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: Bool = False


class SamplingRequest(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    n: Int = 1
    temperature: Float = 1.0
    top_p: Float = 1.0
    stop: str | list[str] | None = None
    seed: Int | None = None
    priority: Int = 0  # lower is served first under --scheduling-policy priority (vLLM's field)
    user: str | None = Field(default=None, max_length=256)  # the tenant, for --scheduling-policy fair
    stream: Bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Float = 0.0
    frequency_penalty: Float = 0.0
    # vLLM extras
    top_k: Int | None = None  # 0 or -1: disabled
    min_p: Float = 0.0
    ignore_eos: Bool = False
    min_tokens: Int = 0
    repetition_penalty: Float = 1.0
    stop_token_ids: TokenIds | None = None
    include_stop_str_in_output: Bool = False
    skip_special_tokens: Bool = True
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)  # keeps prefixes apart
    prompt_logprobs: Int | None = None  # each prompt token's logprob and top-k, in "prompt_logprobs"
    logit_bias: dict[str, Float] | None = None  # OpenAI's: {token id as a string: bias in [-100, 100]}
    allowed_token_ids: TokenIds | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: Int | None = None  # keep the prompt's last k tokens (-1: max_model_len)
    return_tokens_as_token_ids: Bool = False  # logprobs name tokens "token_id:123", not by their text
    return_token_ids: Bool = False  # the prompt's and each choice's token ids in the response
    # Structured outputs, in OpenAI's and vLLM's spellings (entrypoints/openai/structured.py)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    # PD disaggregation (a server with --kv-role): {"do_remote_decode": true} asks a producer to hold
    # the prompt's KV; a producer's returned params make a consumer pull it
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage on every streamed chunk (vLLM asks for include_usage too)."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    def logit_bias_by_id(self) -> dict[int, float] | None:
        """``logit_bias`` keyed by int token ids; raises ValueError for a key that is not one."""
        if self.logit_bias is None:
            return None
        bad_keys = [k for k in self.logit_bias if not (k.isascii() and k.isdigit())]
        if bad_keys:
            raise ValueError(f"logit_bias must be keyed by token ids written as strings (\"123\"), "
                             f"got {bad_keys[:5]!r}")
        return {int(k): v for k, v in self.logit_bias.items()}

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: Int | None = 16
    logprobs: Int | None = None
    echo: Bool = False
    add_special_tokens: Bool = True

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt_form(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Checked by hand, stopping at the first bad element: the schema's union would try each form
        # in turn and, for a long list, collect one error per element per wrong form.
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError(_PROMPT_FORMS)
        if value and type(value[0]) is list:
            for i, ids in enumerate(value):
                if type(ids) is not list or not _all_ints(ids):
                    raise ValueError(f"prompt[{i}] must be a list of token ids; {_PROMPT_FORMS}")
        elif value and type(value[0]) is str:
            if not all(type(text) is str for text in value):
                raise ValueError(f"prompt must not mix strings with other values; {_PROMPT_FORMS}")
        elif not _all_ints(value):
            raise ValueError(_PROMPT_FORMS)
        return value


_PROMPT_FORMS = "prompt must be a string, a list of strings, a list of token ids, or a list of such lists"


def _all_ints(values: list) -> bool:
    return all(type(v) is int for v in values)
