"""What every tool-call parser returns, and the helpers they share.

A parser reads the whole text generated so far and says what it holds: the content meant for the
user and the tool calls, each as far as it arrived. Streaming re-reads the growing text each step
and sends what changed (``streaming.ToolCallDeltas``), so a parser has one method, not two.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import partial_json_parser
from partial_json_parser.core.options import Allow

# Partial strings, objects and arrays are filled in; a number or literal counts once it is whole
# ("1." could still become 1.5, so it must not be shown as 1.0).
_PARTIAL = Allow.STR | Allow.OBJ | Allow.ARR
# Without partial strings: a name is known only once its closing quote arrived.
_WHOLE_STRINGS = Allow.OBJ | Allow.ARR


@dataclass
class ParsedToolCall:
    """One tool call as far as it arrived. ``arguments`` is a JSON value (an object, as a dict) or,
    for a call whose arguments are raw model text, that text."""

    name: str | None  # None until the whole name arrived
    arguments: Any = field(default_factory=dict)
    complete: bool = False
    raw: bool = False  # arguments are the model's text itself, streamed as it comes


@dataclass
class ParsedToolText:
    """The user-visible content (it only grows as the text grows) and the tool calls."""

    content: str
    calls: list[ParsedToolCall] = field(default_factory=list)


class ToolParser(ABC):
    """Reads a model's tool calls out of its generated text."""

    name: ClassVar[str]

    @abstractmethod
    def parse(self, text: str, final: bool) -> ParsedToolText:
        """What ``text`` holds. With ``final`` false the text may still grow: content that could
        turn out to be the start of a tool-call marker is held back."""

    def extract(self, text: str) -> ParsedToolText:
        """The finished text's content and tool calls; a text whose tool calls do not parse is all
        content (a model that meant to call a tool and failed still shows what it wrote)."""
        parsed = self.parse(text, final=True)
        if not parsed.calls:
            return ParsedToolText(parsed.content)
        if any(call.name is None or not call.complete for call in parsed.calls):
            return ParsedToolText(text)
        return parsed


def arguments_json(arguments: Any) -> str:
    """The ``function.arguments`` string of a call: raw text as it is, a JSON value serialized."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def stable_arguments(call: ParsedToolCall) -> str:
    """The part of a call's arguments string that can no longer change: all of it once the call is
    complete; otherwise the serialized partial value without the closing quotes and brackets the
    partial parse filled in (the rest of the value may still come before them)."""
    text = arguments_json(call.arguments)
    if call.complete or call.raw:
        return text
    return text.rstrip('"]}')


def loads_partial(text: str) -> Any:
    """A JSON value from the start of ``text``, as far as it arrived; None when nothing did."""
    try:
        return partial_json_parser.loads(text, _PARTIAL)
    except (partial_json_parser.JSONDecodeError, ValueError, IndexError):
        return None


def loads_whole_strings(text: str) -> Any:
    """Like ``loads_partial``, but a string value appears only once it is whole."""
    try:
        return partial_json_parser.loads(text, _WHOLE_STRINGS)
    except (partial_json_parser.JSONDecodeError, ValueError, IndexError):
        return None


def call_from_json(body: str, arguments_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedToolCall:
    """A ``{"name": ..., "arguments": {...}}`` object (whole or partial) as a tool call."""
    try:
        whole = json.loads(body)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        name = whole.get("name")
        arguments = next((whole[k] for k in arguments_keys if k in whole), {})
        return ParsedToolCall(name if isinstance(name, str) else None, _decoded(arguments), complete=True)
    partial = loads_partial(body)
    named = loads_whole_strings(body)
    if not isinstance(partial, dict):
        return ParsedToolCall(None)
    name = named.get("name") if isinstance(named, dict) else None
    arguments = next((partial[k] for k in arguments_keys if k in partial), {})
    return ParsedToolCall(name if isinstance(name, str) else None, arguments)


def _decoded(arguments: Any) -> Any:
    # Some models write the arguments as a JSON string holding the object.
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return arguments
        return value if isinstance(value, dict) else arguments
    return arguments


def held_back(text: str, marker: str) -> int:
    """How many chars at the end of ``text`` could be the start of ``marker`` (kept back while
    streaming, so a marker is never shown as content)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
