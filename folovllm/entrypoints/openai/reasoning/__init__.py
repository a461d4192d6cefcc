"""Reasoning parsers: each splits one model family's chain of thought from its answer
(``--reasoning-parser NAME``); the chain of thought goes to ``reasoning`` / ``reasoning_content``."""
from __future__ import annotations

from types import MappingProxyType

from folovllm.entrypoints.openai.reasoning.base import ParsedReasoning, ReasoningDeltas, ReasoningParser
from folovllm.entrypoints.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from folovllm.entrypoints.openai.reasoning.qwen3 import Qwen3ReasoningParser

REASONING_PARSERS: MappingProxyType[str, type[ReasoningParser]] = MappingProxyType({
    parser.name: parser for parser in (DeepSeekR1ReasoningParser, Qwen3ReasoningParser)})


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The registered parser called ``name``; a ValueError lists the registered ones."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; registered: "
                         f"{', '.join(sorted(REASONING_PARSERS))}") from None


__all__ = ["REASONING_PARSERS", "ParsedReasoning", "ReasoningDeltas", "ReasoningParser", "get_reasoning_parser"]
