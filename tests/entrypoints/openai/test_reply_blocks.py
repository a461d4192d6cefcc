"""A reply as output blocks (what the Messages and Responses APIs return): streamed block events agree
with the whole reply's blocks, each block starts, grows and stops before the next (no model)."""
from __future__ import annotations

import pytest
from chat_templates import WEATHER_TOOL

from folovllm.entrypoints.openai.chat_reply import ReplyDeltas, ReplyReader
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.reply_blocks import BlockStream, ReplyBlock, reply_blocks
from folovllm.entrypoints.openai.validation import ChatSettings

MESSAGES = [{"role": "user", "content": "Weather in Paris and Lyon?"}]
THOUGHT = "<think>\nThe user wants the weather.\n</think>\n\n"
CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>')


def _reader(settings: ChatSettings, **body) -> ReplyReader:
    return ReplyReader.for_request(ChatCompletionRequest.model_validate({"messages": MESSAGES, **body}), settings)


def _streamed(reader: ReplyReader, text: str, step: int) -> tuple[list, list[ReplyBlock]]:
    deltas, blocks, events = ReplyDeltas(reader), BlockStream(), []
    pieces = [text[i:i + step] for i in range(0, len(text), step)]
    for i, piece in enumerate(pieces):
        events += blocks.advance(deltas.advance(piece, i == len(pieces) - 1))
    return events + blocks.finish(), blocks.blocks


def _shape(blocks: list[ReplyBlock]) -> list[tuple]:
    """Blocks without their ids (each reading makes its own)."""
    return [(b.kind, b.text, b.name) for b in blocks]


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_blocks_are_the_whole_replys(step):
    reader = _reader(ChatSettings(tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="qwen3"),
                     tools=[WEATHER_TOOL])
    text = THOUGHT + "Let me check. " + CALLS
    events, blocks = _streamed(reader, text, step)
    whole = reply_blocks(reader.message(text, "stop")[0])
    assert _shape(blocks) == _shape(whole)
    assert [b.kind for b in blocks] == ["reasoning", "text", "tool_call", "tool_call"]
    assert all(b.call_id.startswith("call_") for b in blocks[2:]) and blocks[2].call_id != blocks[3].call_id
    # one block at a time: start, its deltas, stop, in index order; deltas add up to the block's text
    opened, grown = None, {}
    for event in events:
        if event.kind == "start":
            assert opened is None and event.index == len(grown)
            opened, grown[event.index] = event.index, ""
        elif event.kind == "delta":
            assert event.index == opened and event.delta
            grown[event.index] += event.delta
        else:
            assert event.index == opened
            opened = None
    assert opened is None and [grown[i] for i in sorted(grown)] == [b.text for b in blocks]


def test_a_forced_call_is_one_block_of_json():
    reader = _reader(ChatSettings(), tools=[WEATHER_TOOL], tool_choice="required")
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    events, blocks = _streamed(reader, text, 2)
    assert _shape(blocks) == [("tool_call", '{"city": "Paris"}', "get_weather")]
    assert [e.kind for e in events][0] == "start" and [e.kind for e in events][-1] == "stop"


def test_plain_text_is_one_block_and_nothing_is_no_block():
    reader = _reader(ChatSettings())
    assert _shape(_streamed(reader, "Blue.", 1)[1]) == [("text", "Blue.", None)]
    assert _streamed(reader, "", 1) == ([], [])
    assert reply_blocks(reader.message("", "stop")[0]) == []


def test_a_call_that_grows_after_the_next_block_started_is_an_error():
    blocks = BlockStream()
    blocks.advance({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                    "function": {"name": "f", "arguments": "{"}}]})
    blocks.advance({"content": "text"})
    with pytest.raises(RuntimeError, match="grew after"):
        blocks.advance({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]})
