"""What the Responses API answers, as pydantic models for the OpenAPI schema (the serving module writes
the same shapes as plain dicts)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputTextOut(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class MessageItemOut(BaseModel):
    type: Literal["message"]
    id: str
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputTextOut]


class FunctionCallItemOut(BaseModel):
    """A call the model made: run it and send its result back as a ``function_call_output`` item."""

    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str = Field(description="the call's input: a JSON object, as text")
    status: ItemStatus


class ReasoningTextOut(BaseModel):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItemOut(BaseModel):
    """The reasoning, where the server runs a reasoning parser."""

    type: Literal["reasoning"]
    id: str
    summary: list[Any]
    content: list[ReasoningTextOut]
    status: ItemStatus


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens read from the prefix cache")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(description="the reasoning's tokens, counted by tokenizing its text")


class ResponseUsageOut(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseOut(BaseModel):
    """A response (``stream: true``: the same, built up by the API's typed server-sent events)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[Annotated[MessageItemOut | FunctionCallItemOut | ReasoningItemOut, Field(discriminator="type")]]
    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    text: dict[str, Any]
    truncation: Literal["disabled"]
    store: bool
    previous_response_id: str | None
    metadata: dict[str, str]
    user: str | None
    error: None
    incomplete_details: IncompleteDetails | None
    usage: ResponseUsageOut | None


class DeletedResponseOut(BaseModel):
    id: str
    object: Literal["response"]
    deleted: Literal[True]
