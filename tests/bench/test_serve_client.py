"""The streaming client against canned SSE responses (httpx.MockTransport): what counts as a token
chunk, usage, request bodies, and failures with their reasons."""
import asyncio
import json

import httpx
import pytest

from folovllm.bench.datasets import ServeRequest, adapt_to_endpoint
from folovllm.bench.serve_client import request_body, send_request, wait_for_health


def sse(*payloads):
    return "".join(f"data: {p if isinstance(p, str) else json.dumps(p)}\n\n" for p in payloads).encode()


def run(handler, endpoint, req):
    seen = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    async def go():
        async with httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(record)) as http:
            return await send_request(http, endpoint, "m", req)

    return asyncio.run(go()), seen


def test_completions_stream_counts_text_chunks_and_reads_usage():
    chunks = sse({"choices": [{"index": 0, "text": "Hello"}]}, {"choices": [{"index": 0, "text": ""}]},
                 {"choices": [{"index": 0, "text": " world", "finish_reason": "length"}]},
                 {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
                 "[DONE]")
    out, seen = run(lambda r: httpx.Response(200, content=chunks), "completions",
                    ServeRequest([5, 6, 7], 4, 3))
    assert out.success and len(out.chunk_times) == 2  # the empty-text chunk carries no visible token
    assert out.output_tokens == 4 and out.prompt_tokens == 3  # usage wins over the chunk count
    assert out.send_time <= out.chunk_times[0] <= out.end_time == out.chunk_times[-1]
    body = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/completions"
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 4 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_chat_stream_skips_the_role_chunk_and_counts_chunks_without_usage():
    chunks = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                 {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
                 {"choices": [{"index": 0, "delta": {"content": "!"}}]},
                 {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "[DONE]")
    req = adapt_to_endpoint([ServeRequest("say hi", 8, 2, ignore_eos=False)], "chat")[0]
    out, seen = run(lambda r: httpx.Response(200, content=chunks), "chat", req)
    assert out.success and out.output_tokens == 2 and out.prompt_tokens == 2
    body = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "say hi"}] and "ignore_eos" not in body


@pytest.mark.parametrize("response, reason", [
    (httpx.Response(400, json={"error": {"message": "prompt is too long", "type": "invalid_request_error"}}),
     "HTTP 400: prompt is too long"),
    (httpx.Response(422, json={"detail": [{"msg": "field required"}]}), "HTTP 422: [{'msg': 'field required'}]"),
    (httpx.Response(503, text="busy"), "HTTP 503: busy"),
    (httpx.Response(200, content=sse({"error": {"message": "the server is shutting down"}}, "[DONE]")),
     "stream error: the server is shutting down"),
    (httpx.Response(200, content=sse({"choices": [{"text": "a"}]})), "stream ended without [DONE]"),
])
def test_failures_carry_their_reason(response, reason):
    out, _ = run(lambda r: response, "completions", ServeRequest([1], 2, 1))
    assert not out.success and out.error == reason and out.output_tokens == 0


def test_connection_errors_become_failed_outcomes():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    out, _ = run(refuse, "completions", ServeRequest([1], 2, 1))
    assert out.error == "ConnectError: connection refused"


def test_request_body_rejects_unknown_endpoint():
    with pytest.raises(ValueError, match="endpoint"):
        request_body("classify", "m", ServeRequest([1], 2, 1))


def test_embeddings_body_is_the_input_alone():
    assert request_body("embeddings", "m", ServeRequest([1, 2], 2, 2)) == {"model": "m", "input": [1, 2]}


def test_wait_for_health_polls_until_200_and_stops_on_check_or_timeout(monkeypatch):
    answers = [httpx.ConnectError("refused"), 503, 200]
    urls = []

    def fake_get(url, **kwargs):
        urls.append(url)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer)

    monkeypatch.setattr(httpx, "get", fake_get)
    assert wait_for_health("http://s", timeout_s=10.0, poll_s=0.0)
    assert urls == ["http://s/health"] * 3

    def exited():
        raise RuntimeError("the server exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_for_health("http://s", timeout_s=10.0, check=exited)
    monkeypatch.setattr(httpx, "get", lambda url, **kwargs: httpx.Response(503))
    assert not wait_for_health("http://s", timeout_s=0.05, poll_s=0.01)
