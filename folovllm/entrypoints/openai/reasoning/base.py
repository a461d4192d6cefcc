"""What a reasoning parser returns, and the ``<think>…</think>`` split the registered ones share."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from folovllm.entrypoints.openai.tool_parsers.base import held_back

THINK_START, THINK_END = "<think>", "</think>"


@dataclass
class ParsedReasoning:
    """The chain of thought and the answer; each only grows as the text grows."""

    reasoning: str
    content: str


class ReasoningParser(ABC):
    """Splits a reasoning model's generated text into its reasoning and its answer."""

    name: ClassVar[str]

    @abstractmethod
    def parse(self, text: str, final: bool) -> ParsedReasoning:
        """What ``text`` holds. With ``final`` false the text may still grow: a tail that could be
        the start of a tag is held back."""


def split_after_start(text: str, final: bool) -> ParsedReasoning:
    """``text`` begins inside the reasoning: it runs up to ``</think>``, the answer follows."""
    end = text.find(THINK_END)
    if end >= 0:
        return ParsedReasoning(text[:end], text[end + len(THINK_END):])
    keep = len(text) if final else len(text) - held_back(text, THINK_END)
    return ParsedReasoning(text[:keep], "")


class ReasoningDeltas:
    """Per-choice streaming cursor: the reasoning and content not yet sent."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.reasoning_sent = 0

    def advance(self, text: str, final: bool) -> tuple[str, str]:
        """The new reasoning, and the whole answer so far (the caller tracks what of it it sent)."""
        parsed = self.parser.parse(text, final)
        reasoning = parsed.reasoning[self.reasoning_sent:]
        self.reasoning_sent = max(self.reasoning_sent, len(parsed.reasoning))
        return reasoning, parsed.content
