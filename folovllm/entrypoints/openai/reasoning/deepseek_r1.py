"""DeepSeek-R1 (and its distills): the chat template opens ``<think>`` in the prompt, so the reply
is reasoning up to ``</think>`` and the answer after it; a reply without ``</think>`` (cut short)
is all reasoning. A ``<think>`` the model writes itself is dropped."""
from __future__ import annotations

from folovllm.entrypoints.openai.reasoning.base import THINK_START, ParsedReasoning, ReasoningParser, split_after_start
from folovllm.entrypoints.openai.tool_parsers.base import held_back


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"

    def parse(self, text: str, final: bool) -> ParsedReasoning:
        if text.startswith(THINK_START):
            text = text[len(THINK_START):]
        elif not final and held_back(text, THINK_START) == len(text):
            return ParsedReasoning("", "")  # could still be the opening tag
        return split_after_start(text, final)
