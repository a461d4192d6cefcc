"""tool_choice "required" and a named tool on a model whose template knows no tools: the engine's
structured outputs force the calls' JSON, so any model calls tools. These tests need the engine to
enforce ``SamplingParams.structured_outputs``; without that, the reply is free text and they fail."""
from __future__ import annotations

import json

import pytest
from chat_templates import TIME_TOOL, WEATHER_TOOL

MODEL_NAME = "smol"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# Enough for the calls' JSON at this model's size, small enough to stay quick on CPU.
SAMPLING = {"max_tokens": 64, "temperature": 0.0}


def _check_weather_call(name: str, arguments: str) -> None:
    assert name == "get_weather"
    decoded = json.loads(arguments)
    assert isinstance(decoded, dict) and isinstance(decoded["city"], str)


def _streamed_calls(chunks) -> tuple[list[tuple[str, str]], str | None]:
    calls: dict[int, list[str]] = {}
    finish_reason = None
    for chunk in chunks:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or ():
                entry = calls.setdefault(call.index, ["", ""])
                if call.id is not None:
                    assert call.id.startswith("call_") and call.type == "function"
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    return [tuple(calls[i]) for i in sorted(calls)], finish_reason


def test_required_calls_a_tool(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=[WEATHER_TOOL, TIME_TOOL],
                                           tool_choice="required", **SAMPLING)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls and all(c.id.startswith("call_") for c in choice.message.tool_calls)
    for call in choice.message.tool_calls:
        assert call.function.name in ("get_weather", "get_time")
        assert isinstance(json.loads(call.function.arguments), dict)


def test_named_tool_is_called(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=[WEATHER_TOOL, TIME_TOOL],
                                           tool_choice=NAMED, **SAMPLING)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"  # a named tool keeps the engine's reason, as OpenAI does
    [call] = choice.message.tool_calls
    _check_weather_call(call.function.name, call.function.arguments)


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_streamed_calls_match_the_whole_reply(client, tool_choice):
    request = {"model": MODEL_NAME, "messages": MESSAGES, "tools": [WEATHER_TOOL], "tool_choice": tool_choice,
               **SAMPLING}
    whole = client.chat.completions.create(**request).choices[0]
    calls, finish_reason = _streamed_calls(client.chat.completions.create(stream=True, **request))
    assert calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert finish_reason == whole.finish_reason
    _check_weather_call(*calls[0])
