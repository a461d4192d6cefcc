"""A chat reply as an ordered list of output blocks (reasoning, text, tool calls), whole or streamed.

The Messages and Responses APIs both answer with such a list (Anthropic's content blocks, OpenAI's
output items) and stream it block by block: each block is started, grown by deltas, and stopped
before the next one starts. Both read the reply with the chat path's parsers (``chat_reply``); this
module turns what those parsers give into blocks, and each API writes the blocks in its own shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BlockKind = Literal["reasoning", "text", "tool_call"]


@dataclass
class ReplyBlock:
    """One block: reasoning or answer text, or a tool call (``text`` is then its arguments' JSON)."""

    kind: BlockKind
    text: str = ""
    call_id: str | None = None
    name: str | None = None


@dataclass
class BlockEvent:
    """A block started (``delta`` empty), grown by ``delta``, or stopped (``block`` is then whole)."""

    kind: Literal["start", "delta", "stop"]
    index: int  # the block's place in the reply
    block: ReplyBlock
    delta: str = ""


def reply_blocks(message: dict) -> list[ReplyBlock]:
    """The blocks of a finished reply's assistant message (``ReplyReader.message``'s), in the order a
    stream sends them: reasoning, text, then each tool call."""
    blocks = []
    if message.get("reasoning"):
        blocks.append(ReplyBlock("reasoning", message["reasoning"]))
    if message.get("content"):
        blocks.append(ReplyBlock("text", message["content"]))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        blocks.append(ReplyBlock("tool_call", function["arguments"], call["id"], function["name"]))
    return blocks


class BlockStream:
    """Turns a reply's streamed deltas (``ReplyDeltas.advance``'s dicts) into block events.

    A block stops when a block of another kind (or another tool call) starts, so at most one is
    open at a time; ``finish`` stops the last one.
    """

    def __init__(self) -> None:
        self.blocks: list[ReplyBlock] = []
        self._open: ReplyBlock | None = None
        self._calls: dict[int, ReplyBlock] = {}  # tool calls by their index in the reply's calls

    def advance(self, delta: dict) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        calls = delta.get("tool_calls") or ()
        for call in calls:  # the rest of a call already started came before anything new
            if "id" not in call:
                events += self._grow_call(call)
        if delta.get("reasoning"):
            events += self._grow("reasoning", delta["reasoning"])
        if delta.get("content"):
            events += self._grow("text", delta["content"])
        for call in calls:
            if "id" in call:  # a call's first delta names it
                block = ReplyBlock("tool_call", call_id=call["id"], name=call["function"]["name"])
                self._calls[call["index"]] = block
                events += self._start(block) + self._grow_call(call)
        return events

    def finish(self) -> list[BlockEvent]:
        """Stops the open block, if any."""
        events = self._stop()
        self._open = None
        return events

    def _grow(self, kind: BlockKind, text: str) -> list[BlockEvent]:
        events = []
        if self._open is None or self._open.kind != kind:
            events += self._start(ReplyBlock(kind))
        return events + self._append(text)

    def _grow_call(self, call: dict) -> list[BlockEvent]:
        if self._calls[call["index"]] is not self._open:
            raise RuntimeError(f"tool call {call['index']} grew after the next block started")
        arguments = call.get("function", {}).get("arguments")
        return self._append(arguments) if arguments else []

    def _start(self, block: ReplyBlock) -> list[BlockEvent]:
        events = self._stop()
        self.blocks.append(block)
        self._open = block
        return events + [BlockEvent("start", len(self.blocks) - 1, block)]

    def _append(self, text: str) -> list[BlockEvent]:
        self._open.text += text
        return [BlockEvent("delta", len(self.blocks) - 1, self._open, text)]

    def _stop(self) -> list[BlockEvent]:
        # the open block is always the last one started
        return [] if self._open is None else [BlockEvent("stop", len(self.blocks) - 1, self._open)]
