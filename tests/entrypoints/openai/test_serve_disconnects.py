"""Clients that hang up mid-request: each abandoned request is aborted and logged once at INFO (its id and
tokens so far), nothing is logged as an error, and the server's gauges come back to zero."""
from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import API_KEY, load, parse_metrics, wait_idle

BODY = {"model": "smol", "prompt": "Write a long poem about the sea:", "max_tokens": 400, "temperature": 0,
        "ignore_eos": True}
ABANDONED = re.compile(r"^INFO \S+: request (\S+) abandoned after (\d+) output token\(s\)")


@pytest.fixture(scope="module")
def logged_server(start_server):
    """A server logging at INFO, its stderr read as it comes (a full pipe would stall it)."""
    srv = start_server("--api-key", API_KEY, "--log-level", "info")
    lines: list[str] = []
    try:
        srv.wait_ready()
        reader = threading.Thread(target=lambda: lines.extend(srv.proc.stderr), daemon=True)
        reader.start()
        yield srv, lines
    finally:
        srv.stop()
        srv.kill()


async def _hang_up(client: httpx.AsyncClient, index: int) -> str:
    """Client ``index`` leaves at a different point: a non-streaming one after a while (queued or
    mid-generation), a streaming one after its first token; every fourth stays to the end. Returns the
    id of the request it left ("" if it stayed, or its request was done first)."""
    request_id = f"storm-{index}"
    headers = {"X-Request-Id": request_id}
    if index % 4 == 3:
        response = await client.post("/v1/completions", json={**BODY, "max_tokens": 4}, headers=headers)
        assert response.status_code == 200
        return ""
    if index % 2 == 0:
        try:
            await asyncio.wait_for(client.post("/v1/completions", json=BODY, headers=headers), 0.3 + 0.1 * index)
        except asyncio.TimeoutError:
            return request_id
        return ""  # a fast machine's: done before its client's patience ran out
    async with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}, headers=headers) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                return request_id  # leaving the block closes the connection mid-stream
    raise AssertionError(f"{request_id} sent no chunk")


def test_a_disconnect_storm_is_logged_quietly_and_leaves_nothing_running(logged_server):
    srv, lines = logged_server

    async def storm() -> list[str]:
        async with httpx.AsyncClient(base_url=srv.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
                                     limits=httpx.Limits(max_connections=32), timeout=120) as client:
            return [r for r in await asyncio.gather(*(_hang_up(client, i) for i in range(16))) if r]

    left = asyncio.run(storm())
    assert len(left) >= 6  # every streaming client, and the first non-streaming ones (400 tokens take seconds)
    with httpx.Client(base_url=srv.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as http:
        now = wait_idle(lambda: parse_metrics(http.get("/metrics")))
        assert load(now) == (0, 0, 0)
        assert now["vllm:request_success_total{finished_reason=abort}"] == len(left)
        # the server still answers
        assert http.post("/v1/completions", json={**BODY, "max_tokens": 3}).json()["choices"][0]["text"]
    deadline = time.monotonic() + 10.0  # the log is read on a thread of its own
    while sum(map(bool, map(ABANDONED.match, lines))) < len(left) and time.monotonic() < deadline:
        time.sleep(0.1)
    log = "".join(lines)
    assert not [line for line in lines if line.startswith(("ERROR", "CRITICAL"))], log
    assert "Traceback" not in log and "never retrieved" not in log, log
    abandoned = {m[1]: int(m[2]) for m in map(ABANDONED.match, lines) if m}
    assert sorted(abandoned) == sorted(f"cmpl-{r}" for r in left), log  # once each
    streamed = [f"cmpl-{r}" for r in left if int(r.rsplit("-", 1)[1]) % 2]
    assert all(abandoned[r] >= 1 for r in streamed), log  # they left after their first token
