"""Replaying a finished text through a parser's streaming path, as the server streams it."""
from __future__ import annotations

import json
import random

import pytest

from folovllm.entrypoints.openai.tool_parsers import ToolCallDeltas, ToolParser


def replay(parser: ToolParser, text: str, pieces: list[int]) -> tuple[str, list[dict]]:
    """Streams ``text`` in pieces of the given sizes; returns the content and, per call, the
    {"id", "name", "arguments"} the deltas add up to. Each call is announced once, with its name."""
    deltas = ToolCallDeltas(parser)
    content, calls = "", []
    pos = 0
    while pos < len(text):
        pos = min(len(text), pos + pieces[len(calls) % len(pieces)] if pieces else len(text))
        new_content, new_calls = deltas.advance(text[:pos], pos == len(text))
        content += new_content
        for delta in new_calls:
            if "id" in delta:
                assert delta["index"] == len(calls) and delta["type"] == "function"
                assert delta["id"].startswith("call_") and delta["function"]["name"]
                calls.append({"id": delta["id"], "name": delta["function"]["name"], "arguments": ""})
            calls[delta["index"]]["arguments"] += delta["function"]["arguments"]
    return content, calls


def split_sizes(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 7) for _ in range(32)]


@pytest.fixture(params=["one-char", "tokens", "whole"])
def pieces(request) -> list[int]:
    """Delta sizes: a char at a time, token-like random sizes, or the whole text in one step."""
    return {"one-char": [1], "tokens": split_sizes(0), "whole": []}[request.param]


@pytest.fixture
def check_stream_matches(pieces):
    """Asserts that streaming ``text`` gives the same content and calls as extracting it whole."""

    def check(parser: ToolParser, text: str) -> tuple[str, list[dict]]:
        whole = parser.extract(text)
        content, calls = replay(parser, text, pieces)
        assert content == whole.content
        assert [(c["name"], c["arguments"]) for c in calls] == [
            (c.name, c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments, ensure_ascii=False))
            for c in whole.calls]
        for call in calls:
            json.loads(call["arguments"])  # every streamed arguments string is whole JSON at the end
        return content, calls

    return check
