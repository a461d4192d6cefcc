"""The Responses API on the live server, through the official ``openai`` client: function calls forced
and given back (function_call_output), multi-turn through previous_response_id, retrieve and delete,
text.format, streams read by the client's own parser, and bad input in OpenAI's error shape."""
from __future__ import annotations

import json

import openai
import pytest

from tests.entrypoints.openai.conftest import MODEL_NAME

CITIES = ["Paris", "Lyon"]
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}
NAMED = {"type": "function", "name": "get_weather"}
ASK = "What is the weather in Paris?"


def test_a_forced_call_its_output_and_the_conversation_after(client):
    first = client.responses.create(model=MODEL_NAME, input=ASK, tools=[WEATHER], tool_choice=NAMED,
                                    max_output_tokens=24, temperature=0)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in CITIES and first.status == "completed"
    assert first.store and first.tool_choice.name == "get_weather"
    second = client.responses.create(model=MODEL_NAME, previous_response_id=first.id, tools=[WEATHER],
                                     tool_choice="none", max_output_tokens=12, temperature=0,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "Sunny, 22 C"}])
    assert second.previous_response_id == first.id and second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens  # the stored turn came first
    # the same conversation sent whole gives the same answer
    whole = client.responses.create(model=MODEL_NAME, tools=[WEATHER], tool_choice="none", max_output_tokens=12,
                                    temperature=0, store=False, input=[
                                        {"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
                                        {"type": "function_call_output", "call_id": call.call_id,
                                         "output": "Sunny, 22 C"}])
    assert whole.output_text == second.output_text and whole.usage.input_tokens == second.usage.input_tokens


def test_retrieve_and_delete(client):
    kept = client.responses.create(model=MODEL_NAME, input="Name a color.", max_output_tokens=4, temperature=0)
    fetched = client.responses.retrieve(kept.id)
    assert fetched.id == kept.id and fetched.output_text == kept.output_text and fetched.usage == kept.usage
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL_NAME, previous_response_id=kept.id, input="And?", max_output_tokens=2)
    assert err.value.body["param"] == "previous_response_id"
    unkept = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=2, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_a_streamed_forced_call_in_the_clients_parser(client):
    with client.responses.stream(model=MODEL_NAME, input="Weather in Lyon?", tools=[WEATHER],
                                 tool_choice="required", parallel_tool_calls=False, max_output_tokens=64,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [call] = final.output
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert pieces == call.arguments and json.loads(call.arguments)["city"] in CITIES
    assert client.responses.retrieve(final.id).output[0].call_id == call.call_id  # streamed, then stored


def test_text_format_holds_the_schema(client):
    schema = {"type": "object", "properties": {"color": {"type": "string", "maxLength": 12}},
              "required": ["color"], "additionalProperties": False}
    reply = client.responses.create(model=MODEL_NAME, input="Name a color as JSON.", max_output_tokens=64,
                                    temperature=0, text={"format": {"type": "json_schema", "name": "color",
                                                                    "schema": schema, "strict": True}})
    assert reply.status == "completed" and set(json.loads(reply.output_text)) == {"color"}
    assert reply.text.format.type == "json_schema"


@pytest.mark.parametrize("fields, status, param, says", [
    ({"input": ""}, 400, "input", "input is empty"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input", "item_reference"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, 400, "input",
     "follows no function_call"),
    ({"previous_response_id": "resp_nonesuch"}, 404, "previous_response_id", "resp_nonesuch"),
    ({"tools": [{"type": "web_search"}]}, 400, "tools", "'web_search' tool"),
    ({"tools": [WEATHER]}, 400, "tool_choice", "--enable-auto-tool-choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_time"}}, 400, "tool_choice",
     "not among the tools"),
    ({"background": True}, 400, "background", "background"),
    ({"max_output_tokens": 100_000}, 400, "max_output_tokens", "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonesuch"}}}}, 400,
     "text.format", "text.format"),
])
def test_bad_input_is_a_4xx_naming_its_field(http, fields, status, param, says):
    response = http.post("/v1/responses", json={"model": MODEL_NAME, "input": "Hi", "max_output_tokens": 2, **fields})
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert says in error["message"]


def test_get_and_delete_of_an_unknown_id(http):
    for method in ("GET", "DELETE"):
        response = http.request(method, "/v1/responses/resp_nonesuch")
        assert response.status_code == 404 and response.json()["error"]["code"] == "response_not_found"
