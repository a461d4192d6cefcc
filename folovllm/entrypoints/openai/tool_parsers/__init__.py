"""Tool-call parsers: each reads one model family's tool-call format out of generated text.

``--tool-call-parser NAME`` picks one for tool_choice "auto"; tool_choice "required" and a named
tool use ``forced`` (their output is forced by a JSON schema, so any model can call tools).
"""
from __future__ import annotations

from types import MappingProxyType

from folovllm.entrypoints.openai.tool_parsers.base import ParsedToolCall, ParsedToolText, ToolParser
from folovllm.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from folovllm.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from folovllm.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser
from folovllm.entrypoints.openai.tool_parsers.streaming import ToolCallDeltas

TOOL_PARSERS: MappingProxyType[str, type[ToolParser]] = MappingProxyType({
    parser.name: parser for parser in (HermesToolParser, Llama3JsonToolParser, PythonicToolParser)})


def get_tool_parser(name: str) -> type[ToolParser]:
    """The registered parser called ``name``; a ValueError lists the registered ones."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; registered: {', '.join(sorted(TOOL_PARSERS))}") from None


__all__ = ["TOOL_PARSERS", "ParsedToolCall", "ParsedToolText", "ToolCallDeltas", "ToolParser", "get_tool_parser"]
