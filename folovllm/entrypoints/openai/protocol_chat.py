"""Chat request bodies: messages, tools and tool choice, and the bodies that render a conversation
(chat completions, tokenize)."""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from folovllm.entrypoints.openai.protocol import Bool, Int, SamplingRequest, TokenIds, _Body


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class FunctionCall(BaseModel):
    """A call an assistant turn made: ``arguments`` is a JSON object, as its text (OpenAI's form)
    or as the object itself."""

    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any]

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
    model_config = ConfigDict(extra="allow")  # name, reasoning_content, ... go to the template as given

    role: Role
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

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


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int | None = None
    max_completion_tokens: Int | None = None
    logprobs: Bool = False
    top_logprobs: Int | None = None
    add_generation_prompt: Bool = True
    add_special_tokens: Bool = False
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: Bool | None = None  # False: at most one call per reply
    chat_template: str | None = None  # needs --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None  # template variables, e.g. enable_thinking
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

    def check_supported(self) -> None:
        super().check_supported()
        for i, message in enumerate(self.messages):
            if message.content is None and message.role != "assistant":
                raise ValueError(f"messages[{i}].content must not be null for role {message.role!r} "
                                 "(only an assistant message may leave it out)")
            for part in message.content if isinstance(message.content, list) else ():
                if part.type != "text" or part.text is None:
                    raise ValueError(
                        f"messages[{i}].content parts must be {{'type': 'text', 'text': ...}}; "
                        f"got type {part.type!r}: this server serves a text-only model")


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: Bool = True
    add_generation_prompt: Bool = True
    # rendered as chat completions render them, to see the prompt a chat request makes
    tools: list[ChatTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: Bool = False
    documents: list[dict[str, str]] | None = None


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: TokenIds
