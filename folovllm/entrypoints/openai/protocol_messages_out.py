"""What the Messages API answers, as pydantic models for the OpenAPI schema (the serving module writes
the same shapes as plain dicts), and Anthropic's error body."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

# Anthropic's error type for each status this server gives; any other 5xx is an api_error
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 499: "invalid_request_error", 503: "overloaded_error"}


def anthropic_error(status: int, message: str) -> dict:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class TextBlockOut(BaseModel):
    type: Literal["text"]
    text: str


class ThinkingBlockOut(BaseModel):
    """The reasoning, where the server runs a reasoning parser (its signature is empty)."""

    type: Literal["thinking"]
    thinking: str
    signature: str


class ToolUseBlockOut(BaseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicUsageOut(BaseModel):
    input_tokens: int = Field(description="prompt tokens not read from the prefix cache")
    cache_read_input_tokens: int = Field(description="prompt tokens read from the prefix cache")
    output_tokens: int


class AnthropicMessageOut(BaseModel):
    """A Messages API reply (``stream: true``: the same, as Anthropic's server-sent events)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[Annotated[TextBlockOut | ThinkingBlockOut | ToolUseBlockOut, Field(discriminator="type")]]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    stop_sequence: str | None
    usage: AnthropicUsageOut


class CountTokensOut(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    type: Literal["error"]
    error: AnthropicErrorDetail
