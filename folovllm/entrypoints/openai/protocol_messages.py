"""Anthropic's Messages API request bodies (``/v1/messages``, ``/v1/messages/count_tokens``) and their
reading as one chat request, so the chat path renders, constrains and parses them.

Content blocks: ``text`` anywhere; ``tool_result`` in user messages, answering the ``tool_use`` blocks
of the assistant message just before; ``tool_use`` and ``thinking`` in assistant messages. Any other
block (images, documents, server-tool results) is a 400 that names it. A final assistant message is
the start of the reply (prefill): the reply continues it.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from folovllm.entrypoints.openai.protocol import (
    LIMIT,
    STOP_STRING,
    Bool,
    Float,
    HostedSetting,
    Int,
    ResponseFormat,
    _Body,
    noop_values,
    stated,
)
from folovllm.entrypoints.openai.protocol_chat import (
    ChatCompletionRequest,
    ChatMessage,
    ChatTool,
    MessageToolCall,
    NamedToolChoice,
)

_TEXT_ONLY = "it serves a text-only model"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # a caching hint: the prefix cache is automatic here
    citations: list[dict[str, Any]] | None = None  # an earlier answer's citations: they describe it only


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: Bool = False  # reaches the chat template as the tool message's ``is_error``
    cache_control: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # this server's are empty: the reasoning comes back as it was given


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]
_ROLE_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use", "thinking"),
                "system": ("text",)}


def _known_blocks(value: Any, allowed: tuple[str, ...], where: str) -> Any:
    """A before-validator: each block of a list names a type this server takes (a clear 400 otherwise)."""
    if not isinstance(value, list):
        return value
    for i, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            why = f" ({_TEXT_ONLY})" if kind in ("image", "document") else ""
            raise ValueError(f"{where}[{i}] is a block of type {kind!r}; this server takes "
                             f"{' or '.join(allowed)} blocks there{why}")
    return value


def _role_schema(role: str) -> dict:
    blocks = {"type": "array", "items": {"properties": {"type": {"enum": list(_ROLE_BLOCKS[role])}}}}
    return {"properties": {"role": {"const": role}, "content": {"anyOf": [{"type": "string"}, blocks]}}}


class AnthropicMessage(_Strict):
    """A message whose blocks are of the kinds its role gives (``_ROLE_BLOCKS``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [_role_schema(r) for r in _ROLE_BLOCKS]})

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]

    @model_validator(mode="before")
    @classmethod
    def _blocks_of_the_role(cls, data: Any) -> Any:
        role = data.get("role") if isinstance(data, dict) else None
        if isinstance(role, str) and role in _ROLE_BLOCKS:  # any other role: the schema's 400
            _known_blocks(data.get("content"), _ROLE_BLOCKS[role], "content")
            for i, block in enumerate(data["content"] if isinstance(data.get("content"), list) else ()):
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    _known_blocks(block.get("content"), ("text",), f"content[{i}].content")
        return data

    def blocks(self) -> list:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class AnthropicTool(_Strict):
    """A custom tool: what the model may call, with a JSON schema of its input."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    strict: Bool | None = None
    cache_control: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") not in (None, "custom"):
            raise ValueError(f"{data['type']!r} is a server tool, which this server does not run; give "
                             "custom tools (name, description, input_schema) and run them yourself")
        return data


class AnthropicToolChoice(_Strict):
    """auto: the model decides; any: it calls some tool; tool: it calls the one named; none: no call."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"properties": {"type": {"const": "tool"}}, "required": ["name"]},
        {"properties": {"type": {"enum": ["auto", "any", "none"]}, "name": {"type": "null"}}}]})

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, min_length=1)
    disable_parallel_tool_use: Bool = False

    @model_validator(mode="after")
    def _name_with_tool(self) -> AnthropicToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('name goes with type "tool", and only with it')
        return self


class AnthropicMetadata(_Strict):
    user_id: str | None = Field(default=None, max_length=256)  # the tenant, for --scheduling-policy fair


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    format: JsonOutputFormat | None = None  # the reply's text follows this JSON schema
    effort: HostedSetting = None


class _Conversation(_Body):
    """What a Messages body and a count_tokens body share: the conversation and its tools."""

    states_unimplemented = True

    _extra_noop: ClassVar[dict[str, dict[str, Any]]] = {
        "thinking": noop_values(None),
        "container": noop_values(None),
        "mcp_servers": noop_values(None, []),
        "context_management": noop_values(None),
        "inference_geo": noop_values(None),
        "speed": noop_values(None, "standard"),
        "diagnostics": noop_values(None),
    }
    _extra_metadata: ClassVar[frozenset[str]] = frozenset(
        {"service_tier", "cache_control", "user_profile_id", "workspace_id"})

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_config: OutputConfig | None = None

    @field_validator("system", mode="before")
    @classmethod
    def _system_text(cls, value: Any) -> Any:
        return _known_blocks(value, ("text",), "system")

    def to_chat(self, **sampling: Any) -> ChatCompletionRequest:
        """The same request as a chat completion (``sampling``: its sampling fields); ValueError for a
        conversation Anthropic's rules refuse."""
        last = self.messages[-1]
        prefill = last.role == "assistant"
        fields: dict[str, Any] = {"model": self.model, "messages": self._chat_messages(),
                                  "add_generation_prompt": not prefill, "continue_final_message": prefill}
        if self.tools is not None:
            fields["tools"] = [ChatTool.of(t.name, t.description, t.input_schema, t.strict) for t in self.tools]
        choice = self.tool_choice
        if choice is not None:
            fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or \
                NamedToolChoice.of(choice.name)
            if choice.disable_parallel_tool_use:
                fields["parallel_tool_calls"] = False
        if self.output_config is not None and self.output_config.format is not None:
            fields["response_format"] = ResponseFormat.of_schema(self.output_config.format.schema_)
        return ChatCompletionRequest(**fields, **sampling)

    def _chat_messages(self) -> list[ChatMessage]:
        system = self.system
        chat = [] if system is None else [ChatMessage(role="system", content=_text(system))]
        open_calls: list[str] = []  # the tool_use ids of the assistant message just before
        for i, message in enumerate(self.messages):
            where, blocks = f"messages[{i}]", message.blocks()
            final = i == len(self.messages) - 1
            if not any(_has_content(b) for b in blocks) and not (final and message.role == "assistant"):
                raise ValueError(f"{where}.content must not be empty (only a final assistant message, "
                                 "the start of the reply, may be)")
            answered = {b.tool_use_id for b in blocks if b.type == "tool_result"}
            missing = [call_id for call_id in open_calls if call_id not in answered]
            if missing:
                raise ValueError(f"{where} must answer each tool_use of the message before it with a "
                                 f"tool_result block; none answers {', '.join(missing)}")
            if message.role == "assistant":
                chat.append(_assistant(blocks))
                open_calls = [b.id for b in blocks if b.type == "tool_use"]
                continue
            for j, block in enumerate(blocks):
                if block.type == "tool_result" and block.tool_use_id not in open_calls:
                    raise ValueError(f"{where}.content[{j}]: tool_result for {block.tool_use_id!r} answers no "
                                     "tool_use block of the assistant message just before it")
            chat += _user_or_system(message.role, blocks)
            open_calls = []
        if open_calls:
            raise ValueError(f"messages[{len(self.messages) - 1}] calls tools: give each tool_use its "
                             "tool_result in a user message after it")
        return chat


class MessagesRequest(_Conversation):
    """POST /v1/messages."""

    # required, as Anthropic's API has it; with the prompt, within max_model_len
    max_tokens: Int = stated(..., minimum=1, **{LIMIT: {"maximum": "max_model_len"}})
    stop_sequences: list[str] | None = stated(items=STOP_STRING, **{LIMIT: {"maxItems": "max_stop_strings"}})
    stream: Bool = False
    temperature: Float | None = stated(minimum=0)
    top_p: Float | None = stated(exclusiveMinimum=0, maximum=1)
    top_k: Int | None = stated(minimum=-1)  # 0 or -1: disabled
    metadata: AnthropicMetadata | None = None

    def sampling(self) -> dict[str, Any]:
        """The chat request's sampling fields: only those given, so the model's defaults fill the rest."""
        given = {"max_tokens": self.max_tokens, "stop": self.stop_sequences, "temperature": self.temperature,
                 "top_p": self.top_p, "top_k": self.top_k,
                 "user": self.metadata.user_id if self.metadata is not None else None}
        return {name: value for name, value in given.items() if value is not None}


class CountTokensRequest(_Conversation):
    """POST /v1/messages/count_tokens: the prompt tokens a Messages request with this conversation
    would have."""


def _has_content(block) -> bool:
    return block.type != "text" or bool(block.text)


def _text(blocks: str | list[TextBlock]) -> str:
    return blocks if isinstance(blocks, str) else "".join(b.text for b in blocks)


def _assistant(blocks: list) -> ChatMessage:
    text = "".join(b.text for b in blocks if b.type == "text")
    thinking = "".join(b.thinking for b in blocks if b.type == "thinking")
    calls = [MessageToolCall.of(b.id, b.name, b.input) for b in blocks if b.type == "tool_use"]
    extra = {"reasoning_content": thinking} if thinking else {}
    return ChatMessage(role="assistant", content=text if text or not calls else None,
                       tool_calls=calls or None, **extra)


def _user_or_system(role: str, blocks: list) -> list[ChatMessage]:
    """Text blocks in a row as one message; each tool_result as a tool message, in block order."""
    chat: list[ChatMessage] = []
    texts: list[str] = []
    for block in blocks:
        if block.type == "text":
            texts.append(block.text)
            continue
        if texts:
            chat.append(ChatMessage(role=role, content="".join(texts)))
            texts = []
        extra = {"is_error": True} if block.is_error else {}
        chat.append(ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=block.text, **extra))
    if texts:
        chat.append(ChatMessage(role=role, content="".join(texts)))
    return chat
