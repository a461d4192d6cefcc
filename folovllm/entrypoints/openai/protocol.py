"""Request bodies of the OpenAI API (plus vLLM's sampling extras), as pydantic models.

Types are checked strictly here ("3" is not a number, NaN is not a temperature, text must be valid
Unicode); ranges are checked once, by SamplingParams, so the messages match the offline API's. The schema
states those ranges too (``stated``), and the limits of the server it describes (``LIMIT``, filled in by
openapi.py), so that a body the schema allows is one the server takes.
Responses are built as plain dicts in the serving modules (cheaper per streamed chunk).
"""
from __future__ import annotations

import json
import logging
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    Strict,
    StrictBool,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_validator,
)

logger = logging.getLogger(__name__)


def _integral(value: Any) -> Any:
    """A float with no fraction as the int it equals: JSON Schema's integers include 3.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Numbers must be finite; ints are not bools (nor text), but 3.0 is the integer 3; a JSON int is a fine float.
Float = Annotated[float, Field(allow_inf_nan=False, strict=True)]
Int = Annotated[int, BeforeValidator(_integral), Strict()]
Bool = StrictBool
# A schema keyword whose value is a limit of the server the schema describes: {keyword: limit name}
# (openapi.py's ServerLimits), filled in when the server builds its /openapi.json.
LIMIT = "x-server-limit"
TOKEN_ID_SCHEMA = {"type": "integer", "minimum": 0, LIMIT: {"maximum": "max_token_id"}}
TokenIds = Annotated[list[Int], WithJsonSchema({"type": "array", "items": TOKEN_ID_SCHEMA})]
NonEmptyTokenIds = Annotated[list[Int], WithJsonSchema({"type": "array", "items": TOKEN_ID_SCHEMA, "minItems": 1})]


def stated(default: Any = None, **schema: Any) -> Any:
    """A field's default, with a rule checked elsewhere (SamplingParams' ranges, the server's limits)
    stated in its schema."""
    return Field(default, json_schema_extra=schema)


STOP_STRING = {"type": "string", "minLength": 1, LIMIT: {"maxLength": "max_stop_string_chars"}}
StopStrings = Annotated[str | list[str] | None, WithJsonSchema({"anyOf": [
    STOP_STRING, {"type": "array", "items": STOP_STRING, LIMIT: {"maxItems": "max_stop_strings"}},
    {"type": "null"}]})]


def _absent(value: Any) -> None:
    if value is not None:
        raise ValueError("this is a hosted model's setting, not implemented here; leave it out")
    return value


# A setting only a hosted model has (Anthropic's effort, OpenAI's verbosity): accepted only when absent.
HostedSetting = Annotated[str | None, AfterValidator(_absent), WithJsonSchema({"type": "null"})]


def noop_values(*values: Any) -> dict[str, Any]:
    """The JSON schema of an unimplemented field's no-op values (what ``_NOOP`` maps a field to)."""
    return {"enum": list(values)}


# Fields of the OpenAI API (or vLLM's extensions) that this server does not implement, each with the
# schema of its no-op values: anything else is a 400 that names the field, never a silently different
# result. Unknown keys beyond these are ignored with a log line, as vLLM does. A body's /openapi.json
# schema states each of them (``_Body.states_unimplemented``).
_NOOP: dict[str, dict[str, Any]] = {
    "best_of": noop_values(None, 1),  # or n itself
    "suffix": noop_values(None, ""),
    "use_beam_search": noop_values(None, False),
    "length_penalty": noop_values(None, 1),
    "guided_whitespace_pattern": noop_values(None),
    "logits_processors": noop_values(None),
    "spaces_between_special_tokens": noop_values(None, True),
    "prompt_embeds": noop_values(None),
    "mm_processor_kwargs": noop_values(None, {}),
    "tools": noop_values(None, []),  # chat implements these: on completions they are no-ops
    "tool_choice": noop_values(None, "none"),
    "functions": noop_values(None, []),
    "function_call": noop_values(None, "none"),
    "audio": noop_values(None),
    "modalities": noop_values(None, ["text"]),
    "prediction": noop_values(None),
    "reasoning_effort": noop_values(None),
    "verbosity": noop_values(None),
    "web_search_options": noop_values(None),
    "continue_final_message": noop_values(None, False),
    "documents": noop_values(None),
    "chat_template": noop_values(None),
    "chat_template_kwargs": noop_values(None, {}),
    "store": noop_values(None, False),
    "echo": noop_values(None, False),  # chat only: completions implement it
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
    """The checks every request body gets: valid Unicode, and (where its endpoint calls
    ``check_supported``) no unimplemented field in use."""

    model_config = ConfigDict(extra="allow")
    _extra_noop: ClassVar[dict[str, dict[str, Any]]] = {}  # an endpoint's own, beyond _NOOP
    _extra_metadata: ClassVar[frozenset[str]] = frozenset()  # an endpoint's own, beyond _METADATA
    states_unimplemented: ClassVar[bool] = False  # its endpoint calls check_supported: the schema says so

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema = handler(core_schema)
        if cls.states_unimplemented:
            target = handler.resolve_ref_schema(schema)
            properties = target.setdefault("properties", {})
            for name, noop in {**_NOOP, **cls._extra_noop}.items():
                if name not in cls.model_fields:
                    properties[name] = {**noop, "description": "not implemented here: only its no-op value"}
        return schema

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
                best_of_n = name == "best_of" and type(value) is int and value == getattr(self, "n", None)
                if not _matches(noop, value) and not best_of_n:
                    raise UnsupportedField(name, value)
            elif name not in _METADATA and name not in self._extra_metadata:
                ignored.append(name)
        if ignored:
            logger.warning("ignoring unknown request fields: %s", ", ".join(sorted(ignored)))


def _matches(schema: dict[str, Any], value: Any) -> bool:
    """``value`` against the subset of JSON Schema the no-op table uses: enum, anyOf, and an object whose
    values all match ``additionalProperties``. JSON's equality: 1 is 1.0, but true is not 1."""
    if "anyOf" in schema:
        return any(_matches(option, value) for option in schema["anyOf"])
    if "enum" in schema:
        return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in schema["enum"])
    return isinstance(value, dict) and all(_matches(schema["additionalProperties"], v) for v in value.values())


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

    states_unimplemented = True

    model: str | None = None
    n: Int = stated(1, minimum=1, **{LIMIT: {"maximum": "max_n"}})
    temperature: Float = stated(1.0, minimum=0)
    top_p: Float = stated(1.0, exclusiveMinimum=0, maximum=1)
    stop: StopStrings = None
    seed: Int | None = stated(minimum=-(2**63), exclusiveMaximum=2**63)  # bounds exact as JSON numbers
    priority: Int = 0  # lower is served first under --scheduling-policy priority (vLLM's field)
    user: str | None = Field(default=None, max_length=256)  # the tenant, for --scheduling-policy fair
    stream: Bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Float = stated(0.0, minimum=-2, maximum=2)
    frequency_penalty: Float = stated(0.0, minimum=-2, maximum=2)
    # vLLM extras
    top_k: Int | None = stated(minimum=-1)  # 0 or -1: disabled
    min_p: Float = stated(0.0, minimum=0, maximum=1)
    ignore_eos: Bool = False
    min_tokens: Int = stated(0, minimum=0)  # at most max_tokens
    repetition_penalty: Float = stated(1.0, exclusiveMinimum=0, maximum=2)
    stop_token_ids: TokenIds | None = stated(**{LIMIT: {"maxItems": "max_stop_strings"}})
    include_stop_str_in_output: Bool = False
    skip_special_tokens: Bool = True
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)  # keeps prefixes apart
    # each prompt token's logprob and top-k, in "prompt_logprobs" (not with stream)
    prompt_logprobs: Int | None = stated(minimum=0, maximum=20)
    # OpenAI's: {token id as a string: bias}
    logit_bias: dict[str, Float] | None = stated(propertyNames={"pattern": "^[0-9]+$"},
                                                 additionalProperties={"type": "number", "minimum": -100,
                                                                       "maximum": 100})
    allowed_token_ids: NonEmptyTokenIds | None = None
    bad_words: list[str] | None = stated(items=STOP_STRING, **{LIMIT: {"maxItems": "max_stop_strings"}})
    # keep the prompt's last k tokens (-1: max_model_len)
    truncate_prompt_tokens: Int | None = stated(
        anyOf=[{"type": "integer", "const": -1}, {"type": "integer", "minimum": 1, LIMIT: {"maximum": "max_model_len"}},
               {"type": "null"}])
    return_tokens_as_token_ids: Bool = False  # logprobs name tokens "token_id:123", not by their text
    return_token_ids: Bool = False  # the prompt's and each choice's token ids in the response
    # Structured outputs, in OpenAI's and vLLM's spellings (entrypoints/openai/structured.py)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = stated(minItems=1)
    guided_grammar: str | None = None
    # structured.BACKEND_NAMES (else a 400 naming them)
    guided_decoding_backend: str | None = stated(anyOf=[{"enum": ["auto", "xgrammar"]}, {"type": "null"}])
    # PD disaggregation (a server with --kv-role): {"do_remote_decode": true} asks a producer to hold
    # the prompt's KV; a producer's returned params make a consumer pull it
    kv_transfer_params: dict[str, Any] | None = stated(**{LIMIT: {"type": "kv_transfer_params"}})

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


_PROMPT_TEXT = {"type": "string", "minLength": 1, LIMIT: {"maxLength": "max_prompt_chars"}}
_PROMPT_IDS = {"type": "array", "items": TOKEN_ID_SCHEMA, "minItems": 1}
_PROMPT_SCHEMA = {"anyOf": [
    _PROMPT_TEXT, {"type": "array", "items": _PROMPT_TEXT, "minItems": 1, LIMIT: {"maxItems": "max_prompts"}},
    _PROMPT_IDS, {"type": "array", "items": _PROMPT_IDS, "minItems": 1, LIMIT: {"maxItems": "max_prompts"}}]}


class CompletionRequest(SamplingRequest):
    prompt: Annotated[str | list[str] | TokenIds | list[TokenIds], WithJsonSchema(_PROMPT_SCHEMA)]
    # 0: score the prompt (with echo); prompt tokens + max_tokens must fit max_model_len
    max_tokens: Int | None = stated(16, minimum=0, **{LIMIT: {"maximum": "max_model_len"}})
    logprobs: Int | None = stated(minimum=0, maximum=20)
    echo: Bool = False
    add_special_tokens: Bool = True

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt_form(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Checked by hand, stopping at the first bad element: the schema's union would try each form
        # in turn and, for a long list, collect one error per element per wrong form.
        if isinstance(value, str):
            if not value:
                raise ValueError("prompt must not be empty")
            return value
        if not isinstance(value, list):
            raise ValueError(_PROMPT_FORMS)
        if not value or any(type(item) in (str, list) and not item for item in value):
            raise ValueError("prompt must not be empty, nor hold an empty prompt")
        if type(value[0]) is list:
            lists = [_token_ids(ids) if type(ids) is list else None for ids in value]
            for i, ids in enumerate(lists):
                if ids is None:
                    raise ValueError(f"prompt[{i}] must be a list of token ids; {_PROMPT_FORMS}")
            return lists
        if type(value[0]) is str:
            if not all(type(text) is str for text in value):
                raise ValueError(f"prompt must not mix strings with other values; {_PROMPT_FORMS}")
            return value
        ids = _token_ids(value)
        if ids is None:
            raise ValueError(_PROMPT_FORMS)
        return ids


_PROMPT_FORMS = "prompt must be a string, a list of strings, a list of token ids, or a list of such lists"


def _token_ids(values: list) -> list[int] | None:
    """``values`` as token ids (3.0 is 3), or None when one is not an integer."""
    ids = [_integral(v) for v in values]
    return ids if all(type(v) is int for v in ids) else None
