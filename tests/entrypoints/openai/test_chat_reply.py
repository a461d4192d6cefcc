"""Reading replies into assistant messages: content, reasoning, tool calls and finish reasons, whole
and streamed through the chat endpoint's SSE chunks (scripted engine outputs, no model)."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from chat_templates import WEATHER_TOOL

from folovllm.entrypoints.openai.chat_reply import ReplyDeltas, ReplyReader
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.serving import usage, usage_counts
from folovllm.entrypoints.openai.serving_chat import ChatServing
from folovllm.entrypoints.openai.validation import ChatSettings
from folovllm.outputs import CompletionOutput, RequestMetrics, RequestOutput

MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
HERMES = ChatSettings(tool_call_parser="hermes", enable_auto_tool_choice=True)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THOUGHT = "<think>\nThe user wants the weather.\n</think>\n\n"


def _reader(settings: ChatSettings = ChatSettings(), **body) -> ReplyReader:
    return ReplyReader.for_request(ChatCompletionRequest.model_validate({"messages": MESSAGES, **body}), settings)


def test_plain_reply_is_read_as_it_is():
    reader = _reader()
    assert not reader.reads
    assert reader.message("Hi!", "stop") == ({"role": "assistant", "content": "Hi!"}, "stop")


def test_auto_reply_with_a_call():
    message, finish = _reader(HERMES, tools=[WEATHER_TOOL]).message("Let me check. " + CALL, "stop")
    assert finish == "tool_calls" and message["content"] == "Let me check. "
    [call] = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_auto_reply_without_a_call_keeps_its_finish_reason():
    message, finish = _reader(HERMES, tools=[WEATHER_TOOL]).message("It is sunny.", "length")
    assert finish == "length" and message == {"role": "assistant", "content": "It is sunny."}


def test_only_calls_leave_the_content_null():
    message, _ = _reader(HERMES, tools=[WEATHER_TOOL]).message(CALL, "stop")
    assert message["content"] is None


def test_forced_choices_finish_reasons():
    required = _reader(tools=[WEATHER_TOOL], tool_choice="required")
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    message, finish = required.message(text, "stop")
    assert finish == "tool_calls" and message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert required.message(text, "length")[1] == "length"
    named = _reader(tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message, finish = named.message('{"city": "Paris"}', "stop")
    assert finish == "stop"  # a named tool keeps the engine's reason, as OpenAI does
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_reasoning_then_a_call():
    settings = ChatSettings(tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="qwen3")
    message, finish = _reader(settings, tools=[WEATHER_TOOL]).message(THOUGHT + CALL, "stop")
    assert message["reasoning"] == message["reasoning_content"] == "\nThe user wants the weather.\n"
    assert finish == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "get_weather"
    message, _ = _reader(settings).message("No thinking.", "stop")
    assert message["reasoning"] is None and message["content"] == "No thinking."


def test_forced_replies_are_read_without_the_reasoning_parser():
    settings = ChatSettings(reasoning_parser="deepseek_r1")
    reader = _reader(settings, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message, _ = reader.message('{"city": "Paris"}', "stop")
    assert "reasoning" not in message and message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_streamed_reasoning_and_calls_add_up_to_the_message(step):
    settings = ChatSettings(tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="qwen3")
    reader = _reader(settings, tools=[WEATHER_TOOL])
    text = THOUGHT + "Checking. " + CALL
    deltas = ReplyDeltas(reader)
    reasoning, content, arguments, names = "", "", "", []
    for start in range(0, len(text), step):
        delta = deltas.advance(text[start:start + step], start + step >= len(text))
        assert delta.get("reasoning") == delta.get("reasoning_content")
        reasoning += delta.get("reasoning", "")
        content += delta.get("content", "")
        for call in delta.get("tool_calls", ()):
            names += [call["function"]["name"]] if "name" in call["function"] else []
            arguments += call["function"]["arguments"]
    message, _ = reader.message(text, "stop")
    assert (reasoning, content) == (message["reasoning"], message["content"])
    assert names == ["get_weather"] and arguments == message["tool_calls"][0]["function"]["arguments"]
    assert deltas.called


# -- through the endpoint's response builders --------------------------------------------------

def _serving(settings: ChatSettings) -> ChatServing:
    ctx = SimpleNamespace(model_name="smol", token_text=str, validator=SimpleNamespace(chat_settings=settings),
                          usage=usage, usage_counts=usage_counts)
    return ChatServing(ctx)


def _output(text: str, finish_reason: str | None, num_tokens: int) -> RequestOutput:
    return RequestOutput("r", None, [1, 2], [CompletionOutput(0, text, list(range(num_tokens)), finish_reason=finish_reason)],
                         finish_reason is not None, RequestMetrics(0.0))


def test_response_body_carries_the_calls():
    body = ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": [WEATHER_TOOL]})
    response = _serving(HERMES).response(body, _output(CALL, "stop", 9), "chatcmpl-1",
                                         ReplyReader.for_request(body, HERMES), "smol")
    [choice] = response["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_stream_chunks_carry_indexed_call_deltas():
    body = ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": [WEATHER_TOOL], "stream": True})
    pieces = ["Sure. <tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"ci", "ty\": \"Par", "is\"}}\n</tool_call>"]

    async def outputs():
        text = ""
        for i, piece in enumerate(pieces):
            text += piece
            yield _output(text, "stop" if i == len(pieces) - 1 else None, i + 1)

    async def collect():
        serving = _serving(HERMES)
        return [chunk async for chunk in serving._stream(body, outputs(), "chatcmpl-1", [], [1, 2],
                                                         ReplyReader.for_request(body, HERMES), "smol")]

    chunks = [json.loads(c.removeprefix("data: ")) for c in asyncio.run(collect())]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content", "") for d in deltas) == "Sure. "
    calls = [call for d in deltas for call in d.get("tool_calls", ())]
    assert all(call["index"] == 0 for call in calls)
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "get_weather"
    assert "".join(call["function"]["arguments"] for call in calls) == '{"city": "Paris"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_parallel_tool_calls_false_returns_only_the_first_call():
    two = CALL + "\n" + CALL.replace("Paris", "Lyon")
    assert len(_reader(HERMES, tools=[WEATHER_TOOL]).message(two, "stop")[0]["tool_calls"]) == 2
    reader = _reader(HERMES, tools=[WEATHER_TOOL], parallel_tool_calls=False)
    [call] = reader.message(two, "stop")[0]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    deltas = ReplyDeltas(reader)
    streamed = [deltas.advance(two[i:i + 7], i + 7 >= len(two)) for i in range(0, len(two), 7)]
    indexes = {call["index"] for d in streamed for call in d.get("tool_calls", ())}
    assert indexes == {0}
