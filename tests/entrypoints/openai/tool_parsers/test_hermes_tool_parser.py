"""The hermes parser (Qwen2.5/Qwen3): recorded replies, malformed ones, and streamed ones."""
from __future__ import annotations

import pytest

from folovllm.entrypoints.openai.tool_parsers import get_tool_parser
from folovllm.entrypoints.openai.tool_parsers.hermes import HermesToolParser

# Replies in the form Qwen2.5-Instruct writes them.
ONE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
TWO_CALLS = ('I will look both up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
             '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris", '
             '"hours": [1, 2.5], "exact": true, "note": null}}\n</tool_call>')
UNICODE = '<tool_call>\n{"name": "translate", "arguments": {"text": "naïve \\"café\\" 東京 🌧", "n": -3}}\n</tool_call>'
ARGUMENTS_AS_TEXT = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
NO_ARGUMENTS = '<tool_call>\n{"name": "list_files"}\n</tool_call>'


def test_registered_by_name():
    assert get_tool_parser("hermes") is HermesToolParser
    with pytest.raises(ValueError, match="registered: hermes, llama3_json, pythonic"):
        get_tool_parser("nope")


def test_one_call():
    parsed = HermesToolParser().extract(ONE_CALL)
    assert parsed.content == ""
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Paris", "unit": "celsius"})]


def test_content_before_two_calls():
    parsed = HermesToolParser().extract(TWO_CALLS)
    assert parsed.content == "I will look both up.\n"
    assert [c.name for c in parsed.calls] == ["get_weather", "get_time"]
    assert parsed.calls[1].arguments == {"zone": "Europe/Paris", "hours": [1, 2.5], "exact": True, "note": None}


def test_arguments_written_as_json_text_are_decoded():
    assert HermesToolParser().extract(ARGUMENTS_AS_TEXT).calls[0].arguments == {"x": 1}


def test_a_call_without_arguments_has_empty_ones():
    assert HermesToolParser().extract(NO_ARGUMENTS).calls[0].arguments == {}


@pytest.mark.parametrize("text", [
    "The weather in Paris is sunny.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',  # a brace short
    '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',  # no name
    '<tool_call>\nget_weather(city="Paris")\n</tool_call>',  # not JSON
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',  # cut short by max_tokens
])
def test_text_without_a_whole_call_is_all_content(text):
    parsed = HermesToolParser().extract(text)
    assert parsed.content == text and parsed.calls == []


@pytest.mark.parametrize("text", [ONE_CALL, TWO_CALLS, UNICODE, NO_ARGUMENTS, "Plain answer, no tools.",
                                  "An answer that mentions <tool_call", "<tool_call>\n{\"name\": \"get_we"])
def test_streaming_adds_up_to_the_whole_reply(check_stream_matches, text):
    check_stream_matches(HermesToolParser(), text)


def test_streaming_holds_back_a_partial_marker_and_a_partial_name():
    parser = HermesToolParser()
    assert parser.parse("Sure <tool_c", final=False).content == "Sure "
    assert parser.parse("Sure <tool_c", final=True).content == "Sure <tool_c"
    partial = parser.parse('<tool_call>\n{"name": "get_wea', final=False)
    assert partial.calls[0].name is None  # announced only once the whole name arrived
    partial = parser.parse('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', final=False)
    assert partial.calls[0].name == "get_weather" and partial.calls[0].arguments == {"city": "Pa"}
