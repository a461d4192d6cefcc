"""Anthropic's Messages API on the live server, through the official ``anthropic`` client: create,
stream (its own accumulator rebuilds the message), forced tool calls and the tool-result round trip,
count_tokens, stop reasons, x-api-key, and bad input in Anthropic's error shape."""
from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from tests.entrypoints.openai.conftest import API_KEY, MODEL_NAME

GREEDY = {"extra_body": {"temperature": 0}}  # this client's create() has no sampling parameters of its own
ASK = [{"role": "user", "content": "Name a color."}]
CITIES = ["Paris", "Lyon"]
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                            "required": ["city"], "additionalProperties": False}}
NAMED = {"type": "tool", "name": "get_weather"}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def _anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text[:300]
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]["message"]


def test_create_and_stream_give_the_same_message(claude):
    request = {"model": MODEL_NAME, "max_tokens": 12, "system": "Be brief.", "messages": ASK, **GREEDY}
    whole = claude.messages.create(**request)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == MODEL_NAME
    assert [block.type for block in whole.content] == ["text"] and whole.content[0].text
    assert whole.stop_reason in ("end_turn", "max_tokens")
    with claude.messages.stream(**request) as stream:
        texts = [event.text for event in stream if event.type == "text"]
        streamed = stream.get_final_message()
    assert streamed.content[0].text == whole.content[0].text == "".join(texts)
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    usage = streamed.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_the_raw_stream_is_anthropics_event_sequence(http):
    body = {"model": MODEL_NAME, "max_tokens": 6, "messages": ASK, "stream": True, "temperature": 0}
    with http.stream("POST", "/v1/messages", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [p["type"] for p in payloads] == names  # each event's data names its event
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert payloads[0]["message"]["content"] == [] and payloads[0]["message"]["stop_reason"] is None
    assert payloads[-2]["delta"]["stop_reason"] == "max_tokens" and payloads[-2]["usage"]["output_tokens"] == 6


def test_a_forced_tool_call_and_its_result(claude):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = claude.messages.create(model=MODEL_NAME, max_tokens=24, messages=ask, tools=[WEATHER],
                                   tool_choice=NAMED, **GREEDY)
    [call] = reply.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id
    assert set(call.input) == {"city"} and call.input["city"] in CITIES  # the schema holds
    assert reply.stop_reason == "tool_use"
    answer = claude.messages.create(
        model=MODEL_NAME, max_tokens=12, tools=[WEATHER], tool_choice={"type": "none"}, **GREEDY,
        messages=ask + [{"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                      "content": "Sunny, 22 C"}]}])
    assert answer.content[0].type == "text" and answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens")


def test_any_tool_streams_its_input_as_json_deltas(claude):
    with claude.messages.stream(model=MODEL_NAME, max_tokens=64, tools=[WEATHER], **GREEDY,
                                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                messages=[{"role": "user", "content": "Weather in Lyon?"}]) as stream:
        pieces = [event.delta.partial_json for event in stream
                  if event.type == "content_block_delta" and event.delta.type == "input_json_delta"]
        message = stream.get_final_message()
    [call] = message.content
    assert call.type == "tool_use" and call.input["city"] in CITIES and message.stop_reason == "tool_use"
    assert json.loads("".join(pieces)) == call.input


def test_count_tokens_is_the_prompt_create_runs(claude):
    conversation = {"model": MODEL_NAME, "messages": ASK, "system": "Be brief.", "tools": [WEATHER]}
    counted = claude.messages.count_tokens(**conversation).input_tokens  # tools, no tool_choice: counted as shown
    reply = claude.messages.create(max_tokens=1, tool_choice=NAMED, **conversation, **GREEDY)
    assert counted == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    plain = claude.messages.count_tokens(model=MODEL_NAME, messages=ASK, system="Be brief.").input_tokens
    assert plain <= counted  # the tools count where the template shows them (the default one does not)
    longer = claude.messages.count_tokens(model=MODEL_NAME, system="Be brief.",
                                          messages=[{"role": "user", "content": "Name a color. " * 4}])
    assert longer.input_tokens > plain


def test_stop_sequences_and_max_tokens(claude):
    request = {"model": MODEL_NAME, "messages": ASK, "system": "Be brief.", **GREEDY}
    text = claude.messages.create(max_tokens=12, **request).content[0].text
    stop = text.split()[1]
    stopped = claude.messages.create(max_tokens=12, stop_sequences=[stop], **request)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert stopped.content[0].text == text[:text.index(stop)]
    cut = claude.messages.create(max_tokens=2, **request)
    assert (cut.stop_reason, cut.stop_sequence, cut.usage.output_tokens) == ("max_tokens", None, 2)


def test_x_api_key_works_as_a_bearer_token_does(server):
    body = {"model": MODEL_NAME, "messages": ASK}
    url = f"{server.base_url}/v1/messages/count_tokens"
    assert httpx.post(url, json=body, headers={"x-api-key": API_KEY}).json()["input_tokens"] > 0
    _anthropic_error(httpx.post(url, json=body, headers={"x-api-key": "wrong"}), 401, "authentication_error")
    _anthropic_error(httpx.post(url, json=body), 401, "authentication_error")


@pytest.mark.parametrize("body, status, kind, says", [
    ({"messages": ASK}, 400, "invalid_request_error", "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}], "max_tokens": 4},
     400, "invalid_request_error", "type 'video'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}],
      "max_tokens": 4}, 400, "invalid_request_error", "answers no tool_use"),
    ({"messages": ASK, "max_tokens": 4, "tools": [WEATHER]}, 400, "invalid_request_error", "--enable-auto-tool-choice"),
    ({"messages": ASK, "max_tokens": 4, "thinking": {"type": "enabled", "budget_tokens": 64}},
     400, "invalid_request_error", "thinking"),
    ({"messages": ASK, "max_tokens": 4, "stop_sequences": [""]}, 400, "invalid_request_error", "stop"),
    ({"messages": ASK, "max_tokens": 4, "model": "claude-nonesuch"}, 404, "not_found_error", "claude-nonesuch"),
    ({"messages": ASK, "max_tokens": 100_000}, 400, "invalid_request_error", "max_tokens"),
])
def test_bad_input_gets_anthropics_error_shape(http, body, status, kind, says):
    message = _anthropic_error(http.post("/v1/messages", json={"model": MODEL_NAME, **body}), status, kind)
    assert says in message


def test_errors_from_outside_the_endpoint_are_in_anthropics_shape_too(http):
    _anthropic_error(http.post("/v1/messages", content=b'{"model": "smol",'), 400, "invalid_request_error")
    _anthropic_error(http.post("/v1/messages/nope", json={}), 404, "not_found_error")
    _anthropic_error(http.get("/v1/messages"), 405, "invalid_request_error")
    # chat completions keep OpenAI's shape
    assert set(http.post("/v1/chat/completions", json={}).json()["error"]) == {"message", "type", "param", "code"}


def test_the_client_raises_its_own_errors(claude):
    with pytest.raises(anthropic.BadRequestError, match="answers no tool_use"):
        claude.messages.create(model=MODEL_NAME, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-nonesuch", max_tokens=4, messages=ASK)


def test_requests_count_in_the_servers_metrics(claude, http, scrape):
    before = scrape()
    claude.messages.create(model=MODEL_NAME, max_tokens=2, messages=ASK, **GREEDY)
    http.post("/v1/messages", json={"model": MODEL_NAME, "messages": ASK})  # no max_tokens: rejected
    after = scrape()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("vllm:request_success_total{finished_reason=length}") == 1
    assert delta("vllm:request_rejected_total{status=400}") == 1
