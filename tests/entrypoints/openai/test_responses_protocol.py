"""Responses API bodies read as chat requests (items to messages, calls matched to their outputs, tools,
tool choice, text.format), and the bounded store of responses (no server)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from folovllm.entrypoints.openai.protocol import UnsupportedField
from folovllm.entrypoints.openai.protocol_chat import NamedToolChoice
from folovllm.entrypoints.openai.protocol_responses import INPUT_ITEMS, ResponsesRequest
from folovllm.entrypoints.openai.responses_store import ResponseStore

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}',
        "id": "fc_1", "status": "completed"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}


def _body(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"input": "Hi", **fields})


def _chat(items: list, history: list | None = None, **fields) -> list[dict]:
    return [m.to_template_dict() for m in _body(input=items, **fields).to_chat(history or []).messages]


def test_items_become_chat_messages():
    chat = _chat([{"role": "user", "content": "Weather?"},  # a message may leave its type out
                  {"type": "reasoning", "id": "rs_1", "summary": [],
                   "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
                  {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                   "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
                  CALL, OUTPUT], instructions="Be brief.")
    assert chat == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"}]


def test_a_history_comes_first_and_its_calls_count():
    history = INPUT_ITEMS.validate_python([{"role": "user", "content": "Weather?"}, CALL])
    chat = _chat([OUTPUT], history)
    assert [m["role"] for m in chat] == ["user", "assistant", "tool"]


def test_request_fields_map_to_chat():
    chat = _body(tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False,
                 max_output_tokens=9, temperature=0, user="u",
                 text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}}).to_chat([])
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.parallel_tool_calls is False
    assert (chat.max_tokens, chat.temperature, chat.user) == (9, 0, "u")
    assert chat.response_format.json_schema.json_schema == {"type": "object"}
    assert _body(text={"format": {"type": "json_object"}}).to_chat([]).response_format.type == "json_object"
    assert "temperature" not in _body().to_chat([]).model_fields_set  # the model's default applies


@pytest.mark.parametrize("fields, match", [
    ({"input": ""}, "input is empty"),
    ({"input": []}, "input is empty"),
    ({"input": [OUTPUT]}, "follows no function_call"),
    ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "x"}]}]}, "must come before"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text-only"),
    ({"input": [{**CALL, "arguments": "not json"}]}, "JSON object"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "needs schema"),
])
def test_inputs_that_make_no_conversation(fields, match):
    with pytest.raises(ValueError, match=match):
        _body(**fields).to_chat([])


@pytest.mark.parametrize("fields, match", [
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item 0 is of type 'item_reference'"),
    ({"tools": [{"type": "web_search"}]}, "'web_search' tool"),
    ({"text": {"verbosity": "low"}}, "verbosity"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]}, "encrypted"),
])
def test_bodies_refused_with_their_place(fields, match):
    with pytest.raises(ValidationError, match=match):
        _body(**fields)


def test_unimplemented_fields_are_named():
    with pytest.raises(UnsupportedField, match="background"):
        _body(background=True).check_supported()
    _body(include=[], reasoning={"effort": None}, service_tier="auto", stream_options={}).check_supported()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_store_keeps_the_newest_within_its_count():
    store = ResponseStore(2, 60.0, _Clock())
    for name in "abc":
        store.put(name, {"id": name}, [])
    assert store.get("a") is None and store.get("b").response == {"id": "b"} and len(store) == 2
    assert store.delete("b") and not store.delete("b") and store.get("b") is None


def test_the_store_forgets_after_its_ttl_even_when_read():
    clock = _Clock()
    store = ResponseStore(10, 60.0, clock)
    store.put("a", {}, [])
    clock.now = 30.0
    store.put("b", {}, [])
    assert store.get("a") is not None
    clock.now = 60.0
    assert store.get("a") is None and store.get("b") is not None
    clock.now = 90.0
    assert len(store) == 0


def test_a_store_of_nothing_and_bad_bounds():
    store = ResponseStore(0, 60.0)
    assert not store.enabled
    with pytest.raises(ValueError, match="keeps no responses"):
        store.put("a", {}, [])
    for bounds in ((-1, 60.0), (1, 0.0), (1, float("nan"))):
        with pytest.raises(ValueError, match="--max-stored-responses"):
            ResponseStore(*bounds)
