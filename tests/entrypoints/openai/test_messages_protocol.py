"""Anthropic's Messages bodies read as chat requests: blocks to messages, tool ids checked, prefill,
tool choice and output format mapped, what is not served refused with its place named (no server)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from folovllm.entrypoints.openai.protocol import UnsupportedField
from folovllm.entrypoints.openai.protocol_chat import NamedToolChoice
from folovllm.entrypoints.openai.protocol_messages import CountTokensRequest, MessagesRequest

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]}


def _body(messages: list, **fields) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "messages": messages, **fields})


def _chat(messages: list, **fields) -> list[dict]:
    body = _body(messages, **fields)
    return [m.to_template_dict() for m in body.to_chat(**body.sampling()).messages]


def test_a_tool_round_trip_becomes_chat_messages():
    chat = _chat([{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool."},
                                                    {"type": "text", "text": "Checking."}, USE]},
                  {"role": "user", "content": [RESULT, {"type": "text", "text": "And now?"}]}],
                 system=[{"type": "text", "text": "Be brief."}])
    assert chat == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "Sunny", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "And now?"}]


def test_an_error_result_is_marked_for_the_template():
    chat = _chat([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [USE]},
                  {"role": "user", "content": [{**RESULT, "is_error": True}]}])
    assert chat[-1]["is_error"] is True and chat[-2]["content"] == ""  # a turn that only called a tool


def test_a_final_assistant_message_is_continued():
    body = _body([{"role": "user", "content": "Greek for Sun?"}, {"role": "assistant", "content": "It is"}])
    chat = body.to_chat(**body.sampling())
    assert chat.continue_final_message and not chat.add_generation_prompt
    assert not (c := _body([{"role": "user", "content": "Hi"}]).to_chat()).continue_final_message
    assert c.add_generation_prompt


def test_sampling_fields_only_when_given():
    body = _body([{"role": "user", "content": "Hi"}], stop_sequences=["\n"], top_k=5, temperature=0.5,
                 metadata={"user_id": "tenant-1"})
    chat = body.to_chat(**body.sampling())
    assert (chat.max_tokens, chat.stop, chat.top_k, chat.temperature, chat.user) == (8, ["\n"], 5, 0.5, "tenant-1")
    assert _body([{"role": "user", "content": "Hi"}]).sampling() == {"max_tokens": 8}


@pytest.mark.parametrize("choice, chat_choice, parallel", [
    ({"type": "auto"}, "auto", None), ({"type": "any"}, "required", None), ({"type": "none"}, "none", None),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False)])
def test_tool_choices(choice, chat_choice, parallel):
    chat = _body([{"role": "user", "content": "Hi"}], tools=[TOOL], tool_choice=choice).to_chat()
    assert chat.tool_choice == chat_choice and chat.parallel_tool_calls is parallel
    assert chat.tools[0].function.parameters == TOOL["input_schema"]


def test_a_named_tool_and_an_output_format():
    chat = _body([{"role": "user", "content": "Hi"}], tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"},
                 output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}}).to_chat()
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.function.name == "get_weather"
    assert chat.response_format.json_schema.json_schema == {"type": "object"}


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": [RESULT]}], "answers no tool_use"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [USE]},
      {"role": "user", "content": "And?"}], "none answers toolu_1"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [USE]}], "give each tool_use its tool_result"),
    ([{"role": "user", "content": ""}], "must not be empty"),
    ([{"role": "user", "content": []}], "must not be empty"),
])
def test_conversations_anthropic_refuses(messages, match):
    with pytest.raises(ValueError, match=match):
        _body(messages).to_chat()


@pytest.mark.parametrize("fields, match", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "text-only"),
    ({"messages": [{"role": "user", "content": [{"type": "mystery"}]}]}, "type 'mystery'"),
    ({"messages": [{"role": "user", "content": [USE]}]}, "type 'tool_use'"),
    ({"messages": [{"role": "assistant", "content": [RESULT]}]}, "type 'tool_result'"),
    ({"messages": [{"role": "user", "content": [{**RESULT, "content": [{"type": "image"}]}]}]}, r"content\[0\].content"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
    ({"tool_choice": {"type": "tool"}}, "name goes with"),
    ({"metadata": {"user_id": "u", "other": 1}}, "Extra inputs"),
    ({"output_config": {"effort": "high"}}, "effort"),
    ({"max_tokens": None}, "max_tokens"),
])
def test_bodies_anthropic_refuses(fields, match):
    with pytest.raises(ValidationError, match=match):
        MessagesRequest.model_validate({"model": "m", "max_tokens": 8,
                                        "messages": [{"role": "user", "content": "Hi"}], **fields})


def test_unimplemented_fields_are_named_and_metadata_passes():
    body = _body([{"role": "user", "content": "Hi"}], thinking={"type": "enabled", "budget_tokens": 100})
    with pytest.raises(UnsupportedField, match="thinking"):
        body.check_supported()
    _body([{"role": "user", "content": "Hi"}], service_tier="auto", cache_control={"type": "ephemeral"}).check_supported()


def test_count_tokens_takes_the_conversation_only():
    body = CountTokensRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                                              "tools": [TOOL]})
    chat = body.to_chat()
    assert chat.max_tokens is None and chat.tools[0].function.name == "get_weather"
