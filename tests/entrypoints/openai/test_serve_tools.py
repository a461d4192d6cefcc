"""Tools, reasoning and chat-template options through the live server and the official client."""
from __future__ import annotations

import httpx
import openai
import pytest
from chat_templates import HERMES_TEMPLATE, ROUND_TRIP, WEATHER_TOOL

MODEL_NAME, API_KEY = "smol", "test-key"  # the names conftest starts servers with
SAMPLING = {"max_tokens": 12, "temperature": 0.0}


def test_round_trip_on_the_default_template(client):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=ROUND_TRIP + [{"role": "user", "content": "Thanks. And Lyon?"}],
        tools=[WEATHER_TOOL], tool_choice="none", **SAMPLING)
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert choice.message.content


def test_auto_without_a_parser_is_refused_with_the_flags_to_set(client):
    with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                       tools=[WEATHER_TOOL], **SAMPLING)


def test_legacy_functions_are_refused(client):
    with pytest.raises(openai.BadRequestError, match="use tools instead"):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                       functions=[{"name": "f", "parameters": {}}], **SAMPLING)


@pytest.fixture(scope="module")
def tools_client(start_server, tmp_path_factory):
    """A server started with a tool-call parser, a reasoning parser and a template that shows tools."""
    template = tmp_path_factory.mktemp("templates") / "hermes.jinja"
    template.write_text(HERMES_TEMPLATE)
    server = start_server("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser",
                          "qwen3", "--chat-template", str(template), "--api-key", API_KEY)
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    finally:
        server.stop()
        server.kill()


def _streamed(chunks) -> tuple[dict, str]:
    """A stream's deltas added up into a message, and its finish reason."""
    message = {"content": "", "reasoning": "", "tool_calls": {}}
    finish_reason = None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            message["content"] += delta.content or ""
            message["reasoning"] += (delta.model_extra or {}).get("reasoning") or ""
            for call in delta.tool_calls or ():
                entry = message["tool_calls"].setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    return message, finish_reason


def test_auto_stream_and_whole_reply_agree(tools_client):
    request = {"model": MODEL_NAME, "tools": [WEATHER_TOOL], "tool_choice": "auto", **SAMPLING,
               "messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]}
    whole = tools_client.chat.completions.create(**request)
    streamed, finish_reason = _streamed(tools_client.chat.completions.create(stream=True, **request))
    message = whole.choices[0].message
    assert finish_reason == whole.choices[0].finish_reason
    assert streamed["content"] == (message.content or "")
    assert streamed["reasoning"] == (message.model_extra.get("reasoning") or "")
    assert "reasoning_content" in message.model_extra  # both names: clients read one or the other
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    assert [(c["name"], c["arguments"]) for c in streamed["tool_calls"].values()] == calls
    assert (finish_reason == "tool_calls") == bool(calls)


def test_server_template_shows_the_tools(tools_client):
    messages = [{"role": "user", "content": "Hi"}]
    without = tools_client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1)
    with_tools = tools_client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[WEATHER_TOOL],
                                                      tool_choice="none", max_tokens=1)
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 20


def test_tokenize_renders_the_tools(tools_client):
    messages = [{"role": "user", "content": "Hi"}]
    url = str(tools_client.base_url).removesuffix("/v1/") + "/tokenize"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    plain = httpx.post(url, json={"messages": messages}, headers=headers).json()
    with_tools = httpx.post(url, json={"messages": messages, "tools": [WEATHER_TOOL]}, headers=headers).json()
    assert with_tools["count"] > plain["count"] + 20


def test_round_trip_and_template_kwargs(tools_client):
    reply = tools_client.chat.completions.create(
        model=MODEL_NAME, messages=ROUND_TRIP, tools=[WEATHER_TOOL],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **SAMPLING)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage.prompt_tokens > 0


def test_forced_choices_answer_well_formed_responses(tools_client):
    # Whether the reply obeys the schema is the engine's part (test_forced_tool_choice.py).
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = tools_client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=4, temperature=0.0)
        for call in reply.choices[0].message.tool_calls or ():
            assert call.id.startswith("call_") and call.function.name == "get_weather"
            assert isinstance(call.function.arguments, str)
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        tools_client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_time"}}, **SAMPLING)
