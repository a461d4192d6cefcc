"""Backpressure (503 + Retry-After) and SIGTERM drain (in-flight requests finish, exit code 0)."""
from __future__ import annotations

import json
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


def test_backpressure_then_sigterm_drain(start_server):
    srv = start_server("--max-num-seqs", "1", "--max-waiting-requests", "1")
    try:
        srv.wait_ready()
        body = {"prompt": "Count slowly:", "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.Client(base_url=srv.base_url, timeout=60.0) as a_client, \
                httpx.Client(base_url=srv.base_url, timeout=60.0) as b_client, \
                ThreadPoolExecutor(2) as pool:
            with a_client.stream("POST", "/v1/completions", json=body) as a:
                assert a.status_code == 200
                a_lines = a.iter_lines()
                first_a = next(a_lines)  # A has a token: it is the one running (max-num-seqs 1)
                with b_client.stream("POST", "/v1/completions", json=body) as b:
                    assert b.status_code == 200  # B waits: the queue (1) is now full
                    busy = httpx.post(f"{srv.base_url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
                    assert busy.status_code == 503, busy.text
                    assert busy.headers["Retry-After"] == "1"
                    assert busy.json()["error"]["code"] == "server_busy"

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
