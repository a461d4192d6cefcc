"""Qwen3: the model opens ``<think>`` itself; reasoning runs to ``</think>``, the answer follows.
A reply that does not open with ``<think>`` (``enable_thinking=False``: the template closed an empty
one in the prompt) is all answer. Templates that open ``<think>`` in the prompt want ``deepseek_r1``."""
from __future__ import annotations

from folovllm.entrypoints.openai.reasoning.base import THINK_START, ParsedReasoning, ReasoningParser, split_after_start


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"

    def parse(self, text: str, final: bool) -> ParsedReasoning:
        body = text.lstrip()
        if body.startswith(THINK_START):
            return split_after_start(body[len(THINK_START):], final)
        if not final and THINK_START.startswith(body):
            return ParsedReasoning("", "")  # could still open with <think>
        return ParsedReasoning("", text)
