"""Llama 3.x JSON tool calls: the reply is ``{"name": .., "parameters": {..}}`` (or ``"arguments"``),
optionally after ``<|python_tag|>``, several separated by ``;``. A reply that does not start with
one is content."""
from __future__ import annotations

import json

from folovllm.entrypoints.openai.tool_parsers.base import ParsedToolText, ToolParser, call_from_json

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def parse(self, text: str, final: bool) -> ParsedToolText:
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
        if not final and (not body or PYTHON_TAG.startswith(body)):
            return ParsedToolText("")  # could still become a tool call
        if not body.startswith("{"):
            return ParsedToolText(text)
        parsed = ParsedToolText("")
        pos = 0
        while pos < len(body):
            try:
                _, end = _DECODER.raw_decode(body, pos)
            except ValueError:
                parsed.calls.append(call_from_json(body[pos:]))  # the last one, still arriving
                break
            parsed.calls.append(call_from_json(body[pos:end]))
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
            if pos < len(body) and body[pos] != "{":
                break  # trailing text after the calls is not shown
        return parsed
