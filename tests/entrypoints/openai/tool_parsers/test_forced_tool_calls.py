"""tool_choice "required" / named: the schema that forces the calls, and reading what it forced."""
from __future__ import annotations

import pytest

from folovllm.entrypoints.openai.tool_parsers.forced import (
    NamedToolCall,
    RequiredToolCalls,
    named_tool_schema,
    required_tools_schema,
)

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}
NO_PARAMETERS = {"name": "ping", "parameters": None}


def test_required_schema_is_a_non_empty_array_of_one_of_the_tools():
    schema = required_tools_schema([WEATHER, NO_PARAMETERS])
    assert schema["type"] == "array" and schema["minItems"] == 1
    variants = schema["items"]["anyOf"]
    assert [v["properties"]["name"] for v in variants] == [{"type": "string", "enum": ["get_weather"]},
                                                          {"type": "string", "enum": ["ping"]}]
    assert variants[0]["properties"]["parameters"] == WEATHER["parameters"]
    assert variants[1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    assert all(v["required"] == ["name", "parameters"] for v in variants)


def test_required_schema_moves_defs_to_the_root():
    point = {"type": "object", "properties": {"x": {"type": "number"}}}
    tool = {"name": "move", "parameters": {"type": "object", "$defs": {"Point": point},
                                           "properties": {"to": {"$ref": "#/$defs/Point"}}}}
    schema = required_tools_schema([tool])
    assert schema["$defs"] == {"Point": point}
    assert "$defs" not in schema["items"]["anyOf"][0]["properties"]["parameters"]
    assert "$defs" in tool["parameters"]  # the request's own schema is left as it was
    clash = {"name": "other", "parameters": {"$defs": {"Point": {"type": "string"}}}}
    with pytest.raises(ValueError, match="Point"):
        required_tools_schema([tool, clash])
    with pytest.raises(ValueError, match=r"\$defs must be an object"):
        required_tools_schema([{"name": "bad", "parameters": {"$defs": 5}}])


def test_named_schema_is_the_tools_parameters():
    assert named_tool_schema(WEATHER["parameters"]) == WEATHER["parameters"]
    assert named_tool_schema(None) == {"type": "object", "properties": {}}


REQUIRED_OUTPUT = ('[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
                   '{"name": "ping", "parameters": {}}]')


def test_required_output_is_read_as_calls():
    parsed = RequiredToolCalls().extract(REQUIRED_OUTPUT)
    assert parsed.content == ""
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Paris"}), ("ping", {})]


def test_required_output_that_is_not_an_array_is_content():
    # what an unconstrained model writes, where nothing enforces the schema
    assert RequiredToolCalls().extract("Sure! The weather").content == "Sure! The weather"


@pytest.mark.parametrize("text", [REQUIRED_OUTPUT, "Sure! The weather", '[{"name": "get_weather", "parameters": {"city": "Lyon"}}]'])
def test_required_streaming_adds_up_to_the_whole_reply(check_stream_matches, text):
    check_stream_matches(RequiredToolCalls(), text)


def test_named_output_is_the_arguments_as_written(check_stream_matches):
    text = '{"city": "Paris", "days": 3}'
    parsed = NamedToolCall("get_weather").extract(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", text)]
    check_stream_matches(NamedToolCall("get_weather"), text)


def test_required_schema_without_parallel_calls_holds_exactly_one():
    schema = required_tools_schema([{"name": "a", "parameters": {"type": "object"}}], parallel=False)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    assert "maxItems" not in required_tools_schema([{"name": "a", "parameters": {"type": "object"}}])
