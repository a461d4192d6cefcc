"""The reasoning parsers: deepseek_r1 and qwen3, whole and streamed."""
from __future__ import annotations

import pytest

from folovllm.entrypoints.openai.reasoning import ReasoningDeltas, get_reasoning_parser
from folovllm.entrypoints.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from folovllm.entrypoints.openai.reasoning.qwen3 import Qwen3ReasoningParser

R1 = "Okay, the user asks 2+2. That is 4.\n</think>\n\nThe answer is **4**."
QWEN3 = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"


def test_registered_by_name():
    assert get_reasoning_parser("deepseek_r1") is DeepSeekR1ReasoningParser
    assert get_reasoning_parser("qwen3") is Qwen3ReasoningParser
    with pytest.raises(ValueError, match="registered: deepseek_r1, qwen3"):
        get_reasoning_parser("r2")


@pytest.mark.parametrize("text, reasoning, content", [
    (R1, "Okay, the user asks 2+2. That is 4.\n", "\n\nThe answer is **4**."),
    ("<think>" + R1, "Okay, the user asks 2+2. That is 4.\n", "\n\nThe answer is **4**."),
    ("Still thinking when max_tokens hit", "Still thinking when max_tokens hit", ""),
    ("</think>Answer only", "", "Answer only"),
])
def test_deepseek_r1(text, reasoning, content):
    parsed = DeepSeekR1ReasoningParser().parse(text, final=True)
    assert (parsed.reasoning, parsed.content) == (reasoning, content)


@pytest.mark.parametrize("text, reasoning, content", [
    (QWEN3, "\nThe user greets me.\n", "\n\nHello! How can I help?"),
    ("Hello! (enable_thinking=False)", "", "Hello! (enable_thinking=False)"),
    ("<think>\ncut short", "\ncut short", ""),
])
def test_qwen3(text, reasoning, content):
    parsed = Qwen3ReasoningParser().parse(text, final=True)
    assert (parsed.reasoning, parsed.content) == (reasoning, content)


@pytest.mark.parametrize("parser, text", [(DeepSeekR1ReasoningParser(), R1), (DeepSeekR1ReasoningParser(), "<think>" + R1),
                                          (Qwen3ReasoningParser(), QWEN3), (Qwen3ReasoningParser(), "No thinking here.")])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_streaming_adds_up_to_the_whole_reply(parser, text, step):
    deltas = ReasoningDeltas(parser)
    reasoning, content = "", ""
    for end in range(step, len(text) + step, step):
        piece, content = deltas.advance(text[:end], end >= len(text))
        assert "<think>" not in piece and "</think>" not in piece
        reasoning += piece
    whole = parser.parse(text, final=True)
    assert (reasoning, content) == (whole.reasoning, whole.content)


def test_streaming_holds_back_partial_tags():
    assert DeepSeekR1ReasoningParser().parse("Hmm </thi", final=False).reasoning == "Hmm "
    assert Qwen3ReasoningParser().parse("<thi", final=False).content == ""
    assert Qwen3ReasoningParser().parse("<thi", final=True).content == "<thi"
