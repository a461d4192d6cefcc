"""tools and tool_choice checked before the engine sees them, and the constraint a forced choice sets."""
from __future__ import annotations

import pytest
from chat_templates import TIME_TOOL, WEATHER_TOOL
from pydantic import ValidationError

from folovllm.entrypoints.openai.errors import APIError
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.validation import (
    ChatSettings,
    RequestLimits,
    Validator,
)

MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def plain(smol_tokenizer) -> Validator:
    """The default server: no tool-call parser."""
    return Validator(smol_tokenizer, 512, RequestLimits())


@pytest.fixture(scope="module")
def auto(smol_tokenizer) -> Validator:
    return Validator(smol_tokenizer, 512, RequestLimits(),
                     ChatSettings(tool_call_parser="hermes", enable_auto_tool_choice=True))


def _chat(validator: Validator, **body):
    return validator.chat(ChatCompletionRequest.model_validate({"messages": MESSAGES, **body}))


def _rejected(validator: Validator, **body) -> APIError:
    with pytest.raises(APIError) as info:
        _chat(validator, **body)
    assert info.value.status_code == 400
    return info.value


def test_tool_choice_needs_tools(plain):
    err = _rejected(plain, tool_choice="required")
    assert err.param == "tool_choice" and "needs tools" in err.message
    _chat(plain, tool_choice="none")  # "none" asks for nothing


def test_auto_needs_the_server_flags(plain, auto):
    for body in ({"tools": [WEATHER_TOOL], "tool_choice": "auto"}, {"tools": [WEATHER_TOOL]}):
        err = _rejected(plain, **body)
        assert err.param == "tool_choice"
        assert "--enable-auto-tool-choice" in err.message and "--tool-call-parser" in err.message
        _, params, _ = _chat(auto, **body)
        assert params.structured_outputs is None  # auto is read back by the parser, not forced


def test_required_forces_an_array_of_calls(plain):
    _, params, _ = _chat(plain, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required")
    schema = params.structured_outputs.json
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert [v["properties"]["name"]["enum"] for v in schema["items"]["anyOf"]] == [["get_weather"], ["get_time"]]
    _, params, _ = _chat(plain, tools=[], tool_choice="required")  # nothing to call: as "none"
    assert params.structured_outputs is None


def test_named_forces_that_tools_arguments(plain):
    choice = {"type": "function", "function": {"name": "get_time"}}
    _, params, _ = _chat(plain, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=choice)
    assert params.structured_outputs.json == TIME_TOOL["function"]["parameters"]
    err = _rejected(plain, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.param == "tool_choice" and "'nope'" in err.message and "get_weather" in err.message


def test_none_sets_no_constraint(plain):
    _, params, _ = _chat(plain, tools=[WEATHER_TOOL], tool_choice="none")
    assert params.structured_outputs is None


def test_tool_names_must_differ(plain):
    err = _rejected(plain, tools=[WEATHER_TOOL, WEATHER_TOOL], tool_choice="required")
    assert err.param == "tools" and "get_weather" in err.message


def test_legacy_functions_are_refused_with_the_replacement(plain):
    err = _rejected(plain, functions=[{"name": "f", "parameters": {}}])
    assert err.param == "functions" and "use tools instead" in err.message
    err = _rejected(plain, function_call="auto")
    assert err.param == "function_call" and "use tool_choice instead" in err.message


@pytest.mark.parametrize("body", [
    {"tools": [{"type": "custom", "function": {"name": "f"}}]},
    {"tools": [{"type": "function", "function": {"description": "no name"}}]},
    {"tools": [{"type": "function", "function": {"name": ""}}]},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": "not a schema"}}]},
    {"tools": {"type": "function"}},
    {"tool_choice": "sometimes"},
    {"tool_choice": {"type": "function"}},
    {"tool_choice": {"type": "function", "function": {"name": 5}}},
    {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
    {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}]},
    {"chat_template_kwargs": "enable_thinking"},
    {"continue_final_message": "yes"},
    {"documents": [{"title": 1}]},
])
def test_malformed_shapes_fail_the_schema(body):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": MESSAGES, **body})


def test_completions_still_refuse_tools(plain):
    from folovllm.entrypoints.openai.protocol import CompletionRequest

    with pytest.raises(APIError) as info:
        plain.completion(CompletionRequest.model_validate({"prompt": "Hi", "tools": [WEATHER_TOOL]}))
    assert info.value.param == "tools"
