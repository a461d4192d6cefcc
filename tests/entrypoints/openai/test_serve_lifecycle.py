"""Backpressure (503 + Retry-After, on every generating endpoint) and SIGTERM drain (in-flight requests finish, exit code 0; past
the drain timeout they end with an error instead of a cut-off body)."""
from __future__ import annotations

import asyncio
import json
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx


def _stream_to_end(lines) -> tuple[str, str | None]:
    text, finish = "", None
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        text += choice["text"]
        finish = choice["finish_reason"] or finish
    return text, finish


def test_backpressure_then_sigterm_drain(start_server, tiny_model):
    # the tiny random model starts fast; 1000 tokens (its context is 1024) keep A running while B queues and
    # three more requests are refused (200 tokens ran out before the third of three in turn at times).
    # A drain timeout far above the 2000 tokens' time on a loaded CPU: this test is about finishing them
    srv = start_server("--model", tiny_model, "--max-model-len", "1024", "--max-num-seqs", "1",
                       "--max-waiting-requests", "1", "--drain-timeout", "300")
    try:
        srv.wait_ready()
        body = {"prompt": "Count slowly:", "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.Client(base_url=srv.base_url, timeout=60.0) as a_client, \
                httpx.Client(base_url=srv.base_url, timeout=60.0) as b_client, \
                ThreadPoolExecutor(3) as pool:
            with a_client.stream("POST", "/v1/completions", json=body) as a:
                assert a.status_code == 200
                a_lines = a.iter_lines()
                first_a = next(a_lines)  # A has a token: it is the one running (max-num-seqs 1)
                with b_client.stream("POST", "/v1/completions", json=body) as b:
                    assert b.status_code == 200  # B waits: the queue (1) is now full
                    # every generating endpoint at once (one request's time, not three in turn) while A runs; the
                    # agent APIs queue through the same gate, each answering in its own error shape
                    probes = [("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
                              ("/v1/responses", {"input": "Hi", "max_output_tokens": 2}),
                              ("/v1/messages", {"model": "", "max_tokens": 2,
                                                "messages": [{"role": "user", "content": "Hi"}]})]
                    completions, responses, messages = pool.map(
                        lambda probe: httpx.post(srv.base_url + probe[0], json=probe[1]), probes)
                    assert completions.status_code == 503, completions.text
                    assert completions.headers["Retry-After"] == "1"
                    assert completions.json()["error"]["code"] == "server_busy"
                    assert responses.status_code == 503 and responses.json()["error"]["code"] == "server_busy"
                    assert messages.status_code == 503 and messages.json()["error"]["type"] == "overloaded_error"

                    futures = [pool.submit(_stream_to_end, lines) for lines in (a_lines, b.iter_lines())]
                    assert srv.stop() == 0  # SIGTERM: drains both in-flight streams, then exits cleanly
                    results = [f.result(timeout=5) for f in futures]
        assert first_a.startswith("data: ")
        for text, finish in results:
            assert finish == "length" and text
    finally:
        srv.kill()
    try:
        refused = httpx.post(f"{srv.base_url}/v1/completions", json={"prompt": "Hi"}, timeout=2.0)
        assert refused.status_code == 503
    except httpx.TransportError:
        pass  # the listening socket is closed: new requests are refused


def test_drain_timeout_ends_every_stream_with_an_error(start_server):
    """At the drain timeout each unfinished request is aborted: a stream ends with a 503 error event
    and [DONE], a non-streaming request gets a 503 JSON error; no tracebacks, exit code 0."""
    num_streams = 12
    srv = start_server("--drain-timeout", "2")
    try:
        srv.wait_ready()
        body = {"prompt": "Tell a very long story:", "max_tokens": 480, "temperature": 0,
                "ignore_eos": True}

        async def scenario() -> tuple[list[list[str]], httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60.0,
                                         limits=httpx.Limits(max_connections=num_streams + 1)) as client:
                first_tokens = [asyncio.Event() for _ in range(num_streams)]

                async def stream(started: asyncio.Event) -> list[str]:
                    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                        assert r.status_code == 200
                        lines = []
                        async for line in r.aiter_lines():
                            if line.startswith("data: "):
                                lines.append(line)
                                started.set()
                        return lines

                plain = asyncio.ensure_future(client.post("/v1/completions", json=body))
                streams = asyncio.gather(*(stream(e) for e in first_tokens))
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_tokens)), 60)
                srv.proc.send_signal(signal.SIGTERM)
                return await streams, await plain

        streams, plain = asyncio.run(scenario())
        assert srv.proc.wait(60) == 0
        for lines in streams:
            assert lines[-1] == "data: [DONE]", lines[-3:]
            error = json.loads(lines[-2][6:])["error"]
            assert error["code"] == "shutting_down" and "drain timeout" in error["message"]
        assert plain.status_code == 503, plain.text
        assert plain.json()["error"]["code"] == "shutting_down"
        assert "Traceback" not in srv.proc.stderr.read()
    finally:
        srv.kill()
