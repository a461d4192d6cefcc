"""The llama3_json parser (Llama 3.x): recorded replies, malformed ones, and streamed ones."""
from __future__ import annotations

import pytest

from folovllm.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser

PLAIN = '{"name": "get_weather", "parameters": {"city": "San Francisco, CA", "unit": "fahrenheit"}}'
TAGGED = '<|python_tag|>{"name": "search", "parameters": {"query": "llama \\"3\\""}}'
SEVERAL = ('{"name": "get_weather", "parameters": {"city": "Paris"}}; '
           '{"name": "get_time", "arguments": {"zone": "CET", "offset": 1.5}}')


def test_plain_call():
    parsed = Llama3JsonToolParser().extract(PLAIN)
    assert parsed.content == ""
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("get_weather", {"city": "San Francisco, CA", "unit": "fahrenheit"})]


def test_python_tag_and_arguments_key():
    assert Llama3JsonToolParser().extract(TAGGED).calls[0].arguments == {"query": 'llama "3"'}
    calls = Llama3JsonToolParser().extract(SEVERAL).calls
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                     ("get_time", {"zone": "CET", "offset": 1.5})]


@pytest.mark.parametrize("text", [
    "Paris is sunny today.",
    '{"answer": 42}',  # JSON, but not a call
    '{"name": "get_weather", "parameters": {"city": "Par',  # cut short
    '{"name": "get_weather", "parameters": {"city": "Paris"}',  # a brace short
])
def test_text_without_a_whole_call_is_all_content(text):
    parsed = Llama3JsonToolParser().extract(text)
    assert parsed.content == text and parsed.calls == []


@pytest.mark.parametrize("text", [PLAIN, TAGGED, SEVERAL, "Paris is sunny today.", '{"answer": 42}',
                                  "  " + PLAIN])
def test_streaming_adds_up_to_the_whole_reply(check_stream_matches, text):
    check_stream_matches(Llama3JsonToolParser(), text)


def test_streaming_waits_while_a_reply_could_still_be_a_call():
    parser = Llama3JsonToolParser()
    for start in ["", " ", "<|python", "<|python_tag|>"]:
        assert parser.parse(start, final=False).content == ""
    assert parser.parse("Hello", final=False).content == "Hello"
