"""The Responses API's request body and its input items, read as one chat request so the chat path
renders, constrains and parses it.

Input items: messages (``type`` may be left out), ``function_call`` (an earlier call, as the model gave
it), ``function_call_output`` (its result: it must follow a ``function_call`` with its ``call_id``),
``reasoning`` (given back to the template as the next assistant turn's ``reasoning_content``).
Any other item type is a 400 that names it. A stored response's conversation (``previous_response_id``)
comes before the input; its ``instructions`` do not carry over.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from folovllm.entrypoints.openai.protocol import (
    LIMIT,
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

_TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")  # each with its text
_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


class ResponseContentPart(BaseModel):
    """A text part (or an earlier answer's refusal, with its ``refusal`` text): this server serves text-only
    models."""

    # annotations, logprobs: an earlier answer's, describing it
    model_config = ConfigDict(extra="allow", json_schema_extra={"anyOf": [
        {"properties": {"type": {"enum": list(_TEXT_PARTS)}, "text": {"type": "string"}}, "required": ["text"]},
        {"properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}}, "required": ["refusal"]}]})

    type: str
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            kind = data.get("type")
            if kind not in (*_TEXT_PARTS, "refusal") or not isinstance(data.get(
                    "refusal" if kind == "refusal" else "text"), str):
                raise ValueError(f"a content part must be a text part (input_text, output_text, ... with its text); "
                                 f"got type {kind!r}: this server serves a text-only model")
        return data


def _parts_text(parts: str | list[ResponseContentPart]) -> str:
    if isinstance(parts, str):
        return parts
    return "".join((p.refusal if p.type == "refusal" else p.text) or "" for p in parts)


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # id, status: an earlier answer's

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ResponseContentPart]


class FunctionCallItem(BaseModel):
    """A call the model made in an earlier turn; ``arguments`` is its JSON object as text."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ResponseContentPart]


class ReasoningItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["reasoning"]
    summary: list[ResponseContentPart] = Field(default_factory=list)
    content: list[ResponseContentPart] | None = None
    encrypted_content: Annotated[str | None, WithJsonSchema({"type": "null"})] = None  # refused when given

    @field_validator("encrypted_content")
    @classmethod
    def _plain(cls, value: str | None) -> None:
        if value is not None:
            raise ValueError("this server neither makes nor reads encrypted reasoning; give the reasoning "
                             "as content (reasoning_text parts) or leave the item out")
        return value

    def text(self) -> str:
        return _parts_text(self.content if self.content else self.summary)


def _item_type(value: Any) -> str | None:
    return value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type)]
INPUT_ITEMS = TypeAdapter(list[InputItem])  # reads output items back as the input of a next turn


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None


class FunctionToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=256)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: Bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat | None = None
    verbosity: HostedSetting = None


class ResponsesRequest(_Body):
    """POST /v1/responses."""

    states_unimplemented = True

    _extra_noop: ClassVar[dict[str, dict[str, Any]]] = {
        "conversation": noop_values(None),
        # null, or settings all left empty
        "reasoning": {"anyOf": [noop_values(None), {"type": "object", "additionalProperties": noop_values(
            None, False, 0, "", [], {})}]},
        "background": noop_values(None, False),
        "include": noop_values(None, []),
        "truncation": noop_values(None, "disabled"),
        "top_logprobs": noop_values(None, 0),
        "max_tool_calls": noop_values(None),
        "prompt": noop_values(None),
        "context_management": noop_values(None),
    }
    # how a stream is padded (it is not), how long a hosted cache keeps a prefix: no effect on the answer
    _extra_metadata: ClassVar[frozenset[str]] = frozenset(
        {"stream_options", "prompt_cache_retention", "prompt_cache_options"})

    model: str | None = None
    input: str | list[InputItem] = stated(..., minLength=1, minItems=1)
    instructions: str | None = None
    # with the input, within max_model_len
    max_output_tokens: Int | None = stated(minimum=1, **{LIMIT: {"maximum": "max_model_len"}})
    temperature: Float | None = stated(minimum=0)
    top_p: Float | None = stated(exclusiveMinimum=0, maximum=1)
    stream: Bool = False
    user: str | None = Field(default=None, max_length=256)
    store: Bool | None = None  # None: kept when the server keeps responses (--max-stored-responses)
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: Bool | None = None
    text: TextConfig | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value: Any) -> Any:
        for i, item in enumerate(value if isinstance(value, list) else ()):
            kind = _item_type(item)
            if kind not in _ITEM_TYPES:
                raise ValueError(f"item {i} is of type {kind!r}; this server takes {', '.join(_ITEM_TYPES)} "
                                 "items")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, value: Any) -> Any:
        for i, tool in enumerate(value if isinstance(value, list) else ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise ValueError(f"tool {i} is a {kind!r} tool, which this server does not run; give "
                                 "function tools (type, name, parameters) and run them yourself")
        return value

    def items(self) -> list:
        """The input as items (a string is one user message); ValueError when it holds nothing."""
        if self.input == "" or self.input == []:
            raise ValueError("input is empty; give the text or the items to answer")
        return [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)

    def to_chat(self, history: list) -> ChatCompletionRequest:
        """The same request as a chat completion, after the ``history`` items (a stored response's
        conversation); ValueError for items that do not make a conversation."""
        system = [] if self.instructions is None else [ChatMessage(role="system", content=self.instructions)]
        fields: dict[str, Any] = {"model": self.model, "messages": system + _chat_messages(history, self.items())}
        given = {"max_tokens": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p,
                 "user": self.user, "parallel_tool_calls": self.parallel_tool_calls}
        fields.update({name: value for name, value in given.items() if value is not None})
        if self.tools is not None:
            fields["tools"] = [ChatTool.of(t.name, t.description, t.parameters, t.strict) for t in self.tools]
        if isinstance(self.tool_choice, FunctionToolChoice):
            fields["tool_choice"] = NamedToolChoice.of(self.tool_choice.name)
        elif self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_schema":
            if fmt.schema_ is None:
                raise ValueError("text.format of type json_schema needs schema")
            fields["response_format"] = ResponseFormat.of_schema(fmt.schema_, fmt.name or "response", fmt.strict)
        elif fmt is not None and fmt.type == "json_object":
            fields["response_format"] = ResponseFormat(type="json_object")
        return ChatCompletionRequest(**fields)


def _chat_messages(history: list, items: list) -> list[ChatMessage]:
    """Items as chat messages: function calls join the assistant turn before them, a reasoning item
    goes to the assistant turn after it, each call's output becomes a tool message."""
    chat: list[ChatMessage] = []
    calls: set[str] = set()
    reasoning: list[str] = []
    for i, item in enumerate(history + items):
        where = f"input[{i - len(history)}]" if i >= len(history) else "previous_response_id's conversation"
        if item.type == "reasoning":
            reasoning.append(item.text())
        elif item.type == "function_call":
            calls.add(item.call_id)
            call = MessageToolCall.of(item.call_id, item.name, item.arguments)
            if chat and chat[-1].role == "assistant" and not reasoning:
                chat[-1].tool_calls = [*(chat[-1].tool_calls or ()), call]
            else:
                chat.append(_assistant(None, [call], reasoning))
                reasoning = []
        elif item.type == "function_call_output":
            if item.call_id not in calls:
                raise ValueError(f"{where}: function_call_output for call_id {item.call_id!r} follows no "
                                 "function_call with that call_id")
            chat.append(ChatMessage(role="tool", tool_call_id=item.call_id,
                                    content=_parts_text(item.output)))
        elif item.role == "assistant":
            chat.append(_assistant(_parts_text(item.content), None, reasoning))
            reasoning = []
        else:
            chat.append(ChatMessage(role=item.role, content=_parts_text(item.content)))
    if reasoning:
        raise ValueError("a reasoning item must come before the assistant message or function call it led to")
    return chat


def _assistant(text: str | None, calls: list[MessageToolCall] | None, reasoning: list[str]) -> ChatMessage:
    extra = {"reasoning_content": "".join(reasoning)} if reasoning else {}
    return ChatMessage(role="assistant", content=text, tool_calls=calls, **extra)
