"""The Responses API's request body (plain text generation: no tools, no stored state)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from folovllm.entrypoints.openai.protocol import LIMIT, Bool, Float, Int, _Body, stated
from folovllm.entrypoints.openai.protocol_chat import ChatMessage


class ResponseContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    # input_text | output_text (an earlier answer given back) | text
    type: str = stated(..., enum=["input_text", "output_text", "text"])
    text: str = stated(...)


class ResponseInputMessage(BaseModel):
    """One item of a Responses ``input`` list: a message (other item types need tools)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ResponseContentPart]

    def text(self, where: str) -> str:
        if isinstance(self.content, str):
            return self.content
        for i, part in enumerate(self.content):
            if part.type not in ("input_text", "output_text", "text") or part.text is None:
                raise ValueError(f"{where}.content[{i}] must be an input_text part; got type {part.type!r}: "
                                 "this server serves a text-only model")
        return "".join(p.text or "" for p in self.content)


class ResponsesRequest(_Body):
    """POST /v1/responses: OpenAI's Responses API for plain text generation (no tools, no state)."""

    _extra_noop: ClassVar[dict[str, Callable[[Any], bool]]] = {
        "previous_response_id": lambda v: v is None,
        "conversation": lambda v: v is None,
        "reasoning": lambda v: v is None,
        "background": lambda v: v in (None, False),
        "include": lambda v: v in (None, []),
        "truncation": lambda v: v in (None, "disabled"),
        "text": lambda v: v is None or v == {"format": {"type": "text"}},
        "top_logprobs": lambda v: v in (None, 0),
        "max_tool_calls": lambda v: v is None,
        "prompt": lambda v: v is None,
    }

    model: str | None = None
    input: str | list[ResponseInputMessage] = stated(..., minItems=1)
    instructions: str | None = None
    # with the input, within max_model_len
    max_output_tokens: Int | None = stated(minimum=1, **{LIMIT: {"maximum": "max_model_len"}})
    temperature: Float = stated(1.0, minimum=0)
    top_p: Float = stated(1.0, exclusiveMinimum=0, maximum=1)
    stream: Bool = False
    user: str | None = Field(default=None, max_length=256)
    store: Bool = False  # nothing is kept: a response cannot be fetched again by its id
    metadata: dict[str, str] | None = None

    def messages(self) -> list[ChatMessage]:
        """``instructions`` as a system message, then the input as chat messages."""
        messages = [] if self.instructions is None else [ChatMessage(role="system", content=self.instructions)]
        if isinstance(self.input, str):
            return messages + [ChatMessage(role="user", content=self.input)]
        if not self.input:
            raise ValueError("input must not be empty")
        return messages + [ChatMessage(role=item.role, content=item.text(f"input[{i}]"))
                           for i, item in enumerate(self.input)]
