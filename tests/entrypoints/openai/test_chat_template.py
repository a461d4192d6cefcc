"""Chat rendering: --chat-template, tools, the tool-call round trip, template variables,
continue_final_message, documents and a request's own template."""
from __future__ import annotations

import pytest
from chat_templates import HERMES_TEMPLATE, ROUND_TRIP, WEATHER_TOOL

from folovllm.entrypoints.openai.chat_template import load_chat_template
from folovllm.entrypoints.openai.errors import APIError
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.validation import (
    ChatSettings,
    RequestLimits,
    Validator,
)


def _validator(tokenizer, **settings) -> Validator:
    return Validator(tokenizer, 512, RequestLimits(), ChatSettings(**settings))


def _prompt(validator: Validator, **body) -> str:
    body.setdefault("messages", [{"role": "user", "content": "Weather in Paris?"}])
    prompt, _, _ = validator.chat(ChatCompletionRequest.model_validate(body))
    return validator.tokenizer.decode(prompt["prompt_token_ids"])


@pytest.fixture(scope="module")
def hermes(smol_tokenizer) -> Validator:
    return _validator(smol_tokenizer, chat_template=HERMES_TEMPLATE, tool_call_parser="hermes",
                      enable_auto_tool_choice=True)


def test_server_template_renders_tools(hermes):
    text = _prompt(hermes, tools=[WEATHER_TOOL])
    assert '{"name": "get_weather", "description": "The weather in a city", "parameters":' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_round_trip_renders_calls_as_objects(hermes):
    text = _prompt(hermes, tools=[WEATHER_TOOL], messages=ROUND_TRIP)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<tool_response id="call_1">\n18 C, sunny\n</tool_response>' in text


def test_a_call_without_arguments_renders_empty_ones(hermes):
    messages = [ROUND_TRIP[0], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "list_cities", "arguments": ""}}]}]
    assert '{"name": "list_cities", "arguments": {}}' in _prompt(hermes, messages=messages, add_generation_prompt=False)


def test_round_trip_renders_on_the_default_template(smol_tokenizer):
    text = _prompt(_validator(smol_tokenizer), messages=ROUND_TRIP + [{"role": "user", "content": "And Lyon?"}],
                   tools=[WEATHER_TOOL], tool_choice="none")
    assert "18 C, sunny" in text and "And Lyon?" in text


def test_tool_choice_none_still_shows_the_tools_unless_told_not_to(smol_tokenizer, hermes):
    assert "get_weather" in _prompt(hermes, tools=[WEATHER_TOOL], tool_choice="none")
    excluding = _validator(smol_tokenizer, chat_template=HERMES_TEMPLATE, exclude_tools_when_tool_choice_none=True)
    assert "get_weather" not in _prompt(excluding, tools=[WEATHER_TOOL], tool_choice="none")


def test_template_kwargs_reach_the_template(hermes):
    assert "<think>" in _prompt(hermes, chat_template_kwargs={"enable_thinking": False})
    assert "<think>" not in _prompt(hermes, chat_template_kwargs={"enable_thinking": True})
    with pytest.raises(APIError) as info:
        _prompt(hermes, chat_template_kwargs={"tokenize": True})
    assert info.value.param == "chat_template_kwargs" and "tokenize" in info.value.message


def test_continue_final_message(hermes):
    messages = [{"role": "user", "content": "Count to 3"}, {"role": "assistant", "content": "1, 2,"}]
    text = _prompt(hermes, messages=messages, continue_final_message=True, add_generation_prompt=False)
    assert text.endswith("<|im_start|>assistant\n1, 2,")
    with pytest.raises(APIError) as info:
        _prompt(hermes, messages=messages, continue_final_message=True)
    assert info.value.param == "continue_final_message" and "add_generation_prompt" in info.value.message


def test_documents_reach_the_template(hermes):
    text = _prompt(hermes, documents=[{"title": "Doc A", "text": "Paris is in France."}])
    assert "[Doc A] Paris is in France." in text


def test_request_template_needs_trust(smol_tokenizer, hermes):
    with pytest.raises(APIError) as info:
        _prompt(hermes, chat_template="{{ messages[0].content }}")
    assert info.value.param == "chat_template" and "--trust-request-chat-template" in info.value.message
    trusting = _validator(smol_tokenizer, trust_request_chat_template=True)
    assert _prompt(trusting, chat_template="Q: {{ messages[0].content }}") == "Q: Weather in Paris?"


def test_a_template_that_fails_is_a_400(smol_tokenizer):
    trusting = _validator(smol_tokenizer, trust_request_chat_template=True)
    with pytest.raises(APIError, match="the chat template rejected the messages"):
        _prompt(trusting, chat_template="{{ raise_exception('no tools here') }}")


def test_load_chat_template(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}\n")
    assert load_chat_template(str(path)) == "{{ messages }}\n"
    assert load_chat_template("{{ 'é' }}\\n{{ x }}") == "{{ 'é' }}\n{{ x }}"  # inline, escapes read
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="looks like a file path"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_chat_settings_check_parser_names():
    with pytest.raises(ValueError, match="unknown tool-call parser 'mistral'; registered: hermes, llama3_json, pythonic"):
        ChatSettings(tool_call_parser="mistral")
    with pytest.raises(ValueError, match="unknown reasoning parser 'r2'; registered: deepseek_r1, qwen3"):
        ChatSettings(reasoning_parser="r2")
    with pytest.raises(ValueError, match="--enable-auto-tool-choice needs --tool-call-parser"):
        ChatSettings(enable_auto_tool_choice=True)


def test_serve_flags_become_chat_settings(tmp_path):
    from folovllm.entrypoints.cli import build_parser
    from folovllm.entrypoints.openai.server_args import chat_settings

    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    args = build_parser().parse_args(["serve", "--chat-template", str(path), "--tool-call-parser", "pythonic",
                                      "--enable-auto-tool-choice", "--reasoning-parser", "deepseek_r1"])
    assert chat_settings(args) == ChatSettings(chat_template="{{ messages }}", tool_call_parser="pythonic",
                                               enable_auto_tool_choice=True, reasoning_parser="deepseek_r1")
    with pytest.raises(ValueError, match="registered: hermes, llama3_json, pythonic"):
        chat_settings(build_parser().parse_args(["serve", "--tool-call-parser", "nope"]))
