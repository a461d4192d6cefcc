"""Hermes-style tool calls (Qwen2.5, Qwen3, Hermes): ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``,
one block per call; the text before the first block is the content."""
from __future__ import annotations

from folovllm.entrypoints.openai.tool_parsers.base import ParsedToolText, ToolParser, call_from_json, held_back

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def parse(self, text: str, final: bool) -> ParsedToolText:
        start = text.find(START)
        if start < 0:
            keep = len(text) if final else len(text) - held_back(text, START)
            return ParsedToolText(text[:keep])
        parsed = ParsedToolText(text[:start])
        while start >= 0:
            body_start = start + len(START)
            end = text.find(END, body_start)
            body = text[body_start:end if end >= 0 else len(text)].strip()
            if not body and end < 0:
                break  # the block has only begun
            parsed.calls.append(call_from_json(body))
            start = text.find(START, end + len(END)) if end >= 0 else -1
        return parsed
