"""Reading a chat reply: generated text into the assistant message (content, reasoning, tool calls),
whole or as streamed deltas, and the finish reason that tool calls imply."""
from __future__ import annotations

from dataclasses import dataclass

from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest, ToolMode
from folovllm.entrypoints.openai.reasoning import ReasoningDeltas, ReasoningParser, get_reasoning_parser
from folovllm.entrypoints.openai.tool_parsers import ToolCallDeltas, ToolParser, get_tool_parser
from folovllm.entrypoints.openai.tool_parsers.base import arguments_json
from folovllm.entrypoints.openai.tool_parsers.forced import NamedToolCall, RequiredToolCalls
from folovllm.entrypoints.openai.tool_parsers.streaming import tool_call_id
from folovllm.entrypoints.openai.validation import ChatSettings


@dataclass(frozen=True)
class ReplyReader:
    """The parsers that read one request's replies (None: the text is all content)."""

    tool_mode: ToolMode
    tools: ToolParser | None
    reasoning: ReasoningParser | None
    single_call: bool = False  # parallel_tool_calls false: only a reply's first call is returned

    @classmethod
    def for_request(cls, body: ChatCompletionRequest, settings: ChatSettings) -> ReplyReader:
        mode, named = body.tool_mode
        tools: ToolParser | None = None
        if mode == "auto":
            tools = get_tool_parser(settings.tool_call_parser)()
        elif mode == "required":
            tools = RequiredToolCalls()
        elif mode == "named":
            tools = NamedToolCall(named)
        reasoning = None
        # a forced choice's schema holds from the first token: its reply has no reasoning part
        if settings.reasoning_parser and mode not in ("required", "named"):
            reasoning = get_reasoning_parser(settings.reasoning_parser)()
        return cls(mode, tools, reasoning, single_call=body.parallel_tool_calls is False)

    @property
    def reads(self) -> bool:
        """Whether replies are parsed at all (else their text is the content, as it is)."""
        return self.tools is not None or self.reasoning is not None

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The assistant message of a finished reply, and its finish reason."""
        message: dict = {"role": "assistant"}
        content = text
        if self.reasoning is not None:
            parsed = self.reasoning.parse(text, final=True)
            message["reasoning"] = message["reasoning_content"] = parsed.reasoning or None
            content = parsed.content
        calls = []
        if self.tools is not None:
            parsed_tools = self.tools.extract(content)
            content, calls = parsed_tools.content, parsed_tools.calls
            if self.single_call:
                calls = calls[:1]
        message["content"] = content if content or not calls else None
        if calls:
            message["tool_calls"] = [{"id": tool_call_id(), "type": "function",
                                      "function": {"name": c.name, "arguments": arguments_json(c.arguments)}}
                                     for c in calls]
        return message, self.finish_reason(bool(calls), finish_reason)

    def finish_reason(self, called: bool, finish_reason: str | None) -> str | None:
        """"tool_calls" when a reply ended by calling tools: any call under "auto", a call that
        stopped normally under "required"; a named tool keeps the engine's reason (as OpenAI)."""
        if not called or finish_reason is None:
            return finish_reason
        if self.tool_mode == "auto" or (self.tool_mode == "required" and finish_reason == "stop"):
            return "tool_calls"
        return finish_reason


class ReplyDeltas:
    """Per-choice streaming reader: the delta (content, reasoning, tool calls) of each step."""

    def __init__(self, reader: ReplyReader) -> None:
        self.reader = reader
        self.reasoning = ReasoningDeltas(reader.reasoning) if reader.reasoning is not None else None
        self.tools = ToolCallDeltas(reader.tools) if reader.tools is not None else None
        self.text = ""
        self.content_sent = 0

    @property
    def called(self) -> bool:
        return self.tools is not None and self.tools.called

    def advance(self, new_text: str, final: bool) -> dict:
        """The delta for ``new_text`` (the text since the last call); ``final`` on the last one."""
        self.text += new_text
        delta: dict = {}
        content_text = self.text
        if self.reasoning is not None:
            reasoning, content_text = self.reasoning.advance(self.text, final)
            if reasoning:
                delta["reasoning"] = delta["reasoning_content"] = reasoning
        if self.tools is not None:
            content, calls = self.tools.advance(content_text, final)
            if self.reader.single_call:
                calls = [call for call in calls if call["index"] == 0]
            if calls:
                delta["tool_calls"] = calls
        else:
            content = content_text[self.content_sent:]
            self.content_sent = max(self.content_sent, len(content_text))
        if content:
            delta["content"] = content
        return delta
