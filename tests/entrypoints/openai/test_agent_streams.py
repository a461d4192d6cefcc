"""The Messages and Responses streams of a scripted reply (reasoning, text, two tool calls: what the
small test model cannot be made to write) read by each official client's own stream parser, which
checks the event order and rebuilds the reply; no model, no server."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import anthropic
import httpx2
import openai
import pytest
from chat_templates import WEATHER_TOOL

from folovllm.engine.errors import RequestFailedError
from folovllm.entrypoints.openai.chat_reply import ReplyReader
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.protocol_responses import ResponsesRequest
from folovllm.entrypoints.openai.responses_store import ResponseStore
from folovllm.entrypoints.openai.serving_chat import ChatRun
from folovllm.entrypoints.openai.serving_messages import MessagesServing
from folovllm.entrypoints.openai.serving_responses import ResponsesServing, _Draft
from folovllm.entrypoints.openai.validation import ChatSettings
from folovllm.outputs import CompletionOutput, RequestMetrics, RequestOutput

SETTINGS = ChatSettings(tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="qwen3")
REPLY = ("<think>\nThe user wants two cities.\n</think>\n\nChecking both. "
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>')


class _Stream:
    """Engine outputs of the scripted reply, a few characters at a time."""

    request_id = "r"
    finished = False

    def __init__(self, step: int = 5) -> None:
        self.step = step

    async def __aiter__(self):
        pieces = range(self.step, len(REPLY) + self.step, self.step)
        for n, end in enumerate(pieces):
            done = end >= len(REPLY)
            self.finished = done
            out = CompletionOutput(0, REPLY[:end], list(range(n + 1)), finish_reason="stop" if done else None)
            yield RequestOutput("r", None, [1, 2, 3], [out], done, RequestMetrics(0.0), num_cached_tokens=1)


def _ctx() -> SimpleNamespace:
    async def off_loop(fn, *args):
        return fn(*args)

    return SimpleNamespace(model_name="smol", abort_unfinished=lambda streams: None, off_loop=off_loop,
                           validator=SimpleNamespace(chat_settings=SETTINGS, encode=lambda text, *_: text.split()))


def _run() -> ChatRun:
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Paris and Lyon?"}],
                                                 "tools": [WEATHER_TOOL]})
    return ChatRun(_Stream(), ReplyReader.for_request(body, SETTINGS), [1, 2, 3], [], "smol")


def _whole() -> dict:
    return _run().reader.message(REPLY, "stop")[0]


def _sse(events) -> bytes:
    async def collect() -> str:
        return "".join([chunk async for chunk in events])

    return asyncio.run(collect()).encode()


def _replaying(body: bytes):
    """An HTTP client whose every request is answered with ``body`` as an event stream."""
    return httpx2.Client(transport=httpx2.MockTransport(
        lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)))


def test_the_messages_stream_rebuilds_in_anthropics_client():
    body = _sse(MessagesServing(_ctx(), chat=None)._events(_run(), "msg_1"))
    client = anthropic.Anthropic(base_url="http://test", api_key="k", http_client=_replaying(body))
    with client.messages.stream(model="smol", max_tokens=64, messages=[{"role": "user", "content": "?"}]) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.content[0].thinking == "\nThe user wants two cities.\n"
    assert message.content[1].text == _whole()["content"]  # as chat completions give it
    assert [block.input for block in message.content[2:]] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert message.stop_reason == "tool_use" and message.id == "msg_1"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (2, 1)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    raw = [line[7:] for line in body.decode().splitlines() if line.startswith("event: ")]
    assert raw[:2] == ["message_start", "ping"]
    assert raw.count("content_block_start") == raw.count("content_block_stop") == 4


def test_the_responses_stream_rebuilds_in_openais_client():
    store = ResponseStore(4, 60.0)
    request = ResponsesRequest.model_validate({"input": "Paris and Lyon?", "tools": [
        {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}]})
    serving = ResponsesServing(_ctx(), chat=None, store=store)
    draft = _Draft(request, "resp_1", "smol", store=True)
    body = _sse(serving._events(draft, _run(), request.items()))
    client = openai.OpenAI(base_url="http://test/v1", api_key="k", http_client=_replaying(body))
    with client.responses.stream(model="smol", input="?") as stream:
        kinds = [event.type for event in stream]
        response = stream.get_final_response()
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call", "function_call"]
    assert response.output[0].content[0].text == "\nThe user wants two cities.\n"
    assert response.output_text == _whole()["content"]
    assert [json.loads(item.arguments) for item in response.output[2:]] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert response.usage.output_tokens_details.reasoning_tokens == 5  # the scripted tokenizer splits words
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    numbers = [json.loads(line[6:])["sequence_number"] for line in body.decode().splitlines()
               if line.startswith("data: ")]
    assert numbers == list(range(len(numbers)))
    # stored: the response as streamed, and a conversation that continues with the calls' outputs
    stored = store.get("resp_1")
    assert [item["id"] for item in stored.response["output"]] == [item.id for item in response.output]
    assert [item.type for item in stored.items] == ["message", "reasoning", "message", "function_call", "function_call"]


class _FailingStream(_Stream):
    """The engine fails the request after its first output."""

    async def __aiter__(self):
        async for output in super().__aiter__():
            yield output
            raise RequestFailedError()


def test_an_engine_failure_ends_the_messages_stream_with_an_error_event():
    run = _run()
    run.stream = _FailingStream()
    body = _sse(MessagesServing(_ctx(), chat=None)._events(run, "msg_1"))
    client = anthropic.Anthropic(base_url="http://test", api_key="k", http_client=_replaying(body))
    with pytest.raises(anthropic.APIStatusError) as err:
        with client.messages.stream(model="smol", max_tokens=64, messages=[{"role": "user", "content": "?"}]) as stream:
            stream.get_final_message()
    assert err.value.body == {"type": "error", "error": {"type": "api_error", "message": str(RequestFailedError())}}
