"""Streaming tool calls: each step's parse of the whole text, turned into OpenAI deltas."""
from __future__ import annotations

import uuid

from folovllm.entrypoints.openai.tool_parsers.base import ToolParser, stable_arguments


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallDeltas:
    """Per-choice cursor over a growing text: what content and tool-call pieces were not sent yet.

    A call is announced (index, id, type, name) once its whole name arrived; its arguments follow
    as ``function.arguments`` pieces whose concatenation is the non-streaming arguments string.
    """

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.content_sent = 0
        self.ids: list[str] = []
        self.arguments_sent: list[str] = []

    @property
    def called(self) -> bool:
        """Whether any tool call was announced."""
        return bool(self.ids)

    def advance(self, text: str, final: bool) -> tuple[str, list[dict]]:
        """The new content and the new tool-call deltas for ``text`` (the whole text so far)."""
        parsed = self.parser.parse(text, final)
        if final and not self.ids:
            # Nothing was announced: the finished text's strict reading decides (a failed call is content).
            parsed = self.parser.extract(text)
        content = parsed.content[self.content_sent:] if len(parsed.content) > self.content_sent else ""
        self.content_sent = max(self.content_sent, len(parsed.content))
        deltas = []
        for index, call in enumerate(parsed.calls):
            if index == len(self.ids):
                if call.name is None:
                    break
                self.ids.append(tool_call_id())
                self.arguments_sent.append("")
                deltas.append({"index": index, "id": self.ids[index], "type": "function",
                               "function": {"name": call.name, "arguments": ""}})
            stable = stable_arguments(call)
            sent = self.arguments_sent[index]
            if len(stable) > len(sent) and stable.startswith(sent):
                piece = stable[len(sent):]
                self.arguments_sent[index] = stable
                if deltas and deltas[-1]["index"] == index:
                    deltas[-1]["function"]["arguments"] += piece
                else:
                    deltas.append({"index": index, "function": {"arguments": piece}})
        return content, deltas
