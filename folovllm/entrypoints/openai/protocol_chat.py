"""Chat request bodies: messages, tools and tool choice, and the bodies that render a conversation
(chat completions, tokenize)."""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from folovllm.entrypoints.openai.chat_template import RESERVED_TEMPLATE_KWARGS
from folovllm.entrypoints.openai.protocol import LIMIT, Bool, Int, SamplingRequest, TokenIds, _Body, stated


class ContentPart(BaseModel):
    """A part of a message's content: text (this server serves text-only models)."""

    model_config = ConfigDict(extra="allow")

    type: str = stated(..., const="text")
    text: str = stated(...)

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and (data.get("type") != "text" or not isinstance(data.get("text"), str)):
            raise ValueError(f"content parts must be {{'type': 'text', 'text': ...}}; got type {data.get('type')!r}: "
                             "this server serves a text-only model")
        return data


Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class FunctionCall(BaseModel):
    """A call an assistant turn made: ``arguments`` is a JSON object, as its text (OpenAI's form)
    or as the object itself."""

    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] = stated(..., anyOf=[
        {"type": "string", "contentMediaType": "application/json", "contentSchema": {"type": "object"}},
        {"type": "object"}])

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(value, str) and value:  # empty: a call without arguments
            try:
                decoded = json.loads(value)
            except ValueError:
                raise ValueError("function.arguments must be a JSON object (as text); got text that "
                                 "is not JSON") from None
            if not isinstance(decoded, dict):
                raise ValueError("function.arguments must be a JSON object (as text)")
        return value


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall

    @classmethod
    def of(cls, call_id: str, name: str, arguments: str | dict[str, Any]) -> MessageToolCall:
        return cls(id=call_id, function=FunctionCall(name=name, arguments=arguments))


class ChatMessage(BaseModel):
    # name, reasoning_content, ... go to the template as given; content may be left out (or null) by an
    # assistant message alone (one that only called tools)
    model_config = ConfigDict(extra="allow", json_schema_extra={"anyOf": [
        {"properties": {"role": {"const": "assistant"}}},
        {"required": ["content"], "properties": {"content": {"type": ["string", "array"]}}}]})

    role: Role
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_given(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content must not be null for role {self.role!r} (only an assistant message may "
                             "leave it out)")
        return self

    def to_template_dict(self) -> dict:
        """The message as chat templates read it: text content, and each call's arguments as an
        object (templates serialize or iterate them)."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            message["content"] = "".join(p.text or "" for p in self.content)
        elif self.content is None:
            message["content"] = ""  # an assistant turn that only called tools
        for call in message.get("tool_calls", ()):
            arguments = call["function"]["arguments"]
            if isinstance(arguments, str):
                call["function"]["arguments"] = json.loads(arguments) if arguments else {}
        return message


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: Bool | None = None


class ChatTool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition

    @classmethod
    def of(cls, name: str, description: str | None, parameters: dict[str, Any] | None,
           strict: bool | None) -> ChatTool:
        return cls(type="function", function=FunctionDefinition(name=name, description=description,
                                                                parameters=parameters, strict=strict))


class NamedFunction(BaseModel):
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    """``{"type": "function", "function": {"name": ...}}``: that tool must be called."""

    type: Literal["function"]
    function: NamedFunction

    @classmethod
    def of(cls, name: str) -> NamedToolChoice:
        return cls(type="function", function=NamedFunction(name=name))


ToolMode = Literal["none", "auto", "required", "named"]


# a template's variables are not the request's own fields (chat_template.RESERVED_TEMPLATE_KWARGS)
_TEMPLATE_KWARGS = {"propertyNames": {"not": {"enum": sorted(RESERVED_TEMPLATE_KWARGS)}}}
_MAX_TOKENS = {"minimum": 1, LIMIT: {"maximum": "max_model_len"}}  # with the prompt, within max_model_len


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int | None = stated(**_MAX_TOKENS)
    max_completion_tokens: Int | None = stated(**_MAX_TOKENS)
    logprobs: Bool = False
    top_logprobs: Int | None = stated(minimum=0, maximum=20)  # with logprobs true
    add_generation_prompt: Bool = True
    add_special_tokens: Bool = False
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: Bool | None = None  # False: at most one call per reply
    chat_template: str | None = stated(**{LIMIT: {"type": "request_chat_template"}})  # --trust-request-chat-template
    # template variables, e.g. enable_thinking; not the request's own fields
    chat_template_kwargs: dict[str, Any] | None = stated(**_TEMPLATE_KWARGS)
    continue_final_message: Bool = False  # the reply continues the last (assistant) message
    documents: list[dict[str, str]] | None = None  # for retrieval-augmented templates

    @property
    def tool_mode(self) -> tuple[ToolMode, str | None]:
        """How tools are used, and the tool a named choice names. Without tool_choice, tools mean
        "auto"; "required" with an empty tools list means "none" (OpenAI's reading)."""
        choice = self.tool_choice
        if choice is None:
            return ("auto" if self.tools else "none"), None
        if isinstance(choice, NamedToolChoice):
            return "named", choice.function.name
        if choice == "required" and self.tools == []:
            return "none", None
        return choice, None



class TokenizeRequest(_Body):
    """A prompt's tokens: exactly one of ``prompt`` and ``messages`` (rendered as a chat completion's)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]})

    model: str | None = None
    prompt: str | None = stated(**{LIMIT: {"maxLength": "max_prompt_chars"}})
    messages: list[ChatMessage] | None = stated(minItems=1)
    add_special_tokens: Bool = True
    add_generation_prompt: Bool = True
    # rendered as chat completions render them, to see the prompt a chat request makes
    tools: list[ChatTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = stated(**_TEMPLATE_KWARGS)
    continue_final_message: Bool = False
    documents: list[dict[str, str]] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: TokenIds
