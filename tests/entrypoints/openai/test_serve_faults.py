"""A request the engine fails on gets a 500 error (a stream: an error event, then [DONE]) while the
requests batched with it finish normally, and the server keeps serving. Plumbing, not numerics: the
server runs the tiny random model."""
from __future__ import annotations

import asyncio
import json

import httpx

from tests.entrypoints.openai.conftest import MODEL_NAME
from tests.entrypoints.openai.faulty_server import FAULTY_MAX_TOKENS

GOOD = {"model": MODEL_NAME, "prompt": "The first three planets are", "max_tokens": 24,
        "temperature": 0, "ignore_eos": True}
BAD = {**GOOD, "prompt": "Count to ten:", "max_tokens": FAULTY_MAX_TOKENS}


async def _stream(client: httpx.AsyncClient, body: dict) -> list[str]:
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        return [line async for line in response.aiter_lines() if line.startswith("data: ")]


def _text(lines: list[str]) -> tuple[str, str | None]:
    text, finish = "", None
    for line in lines[:-1]:
        choice = json.loads(line[6:])["choices"][0]
        text += choice["text"]
        finish = choice["finish_reason"] or finish
    return text, finish


def test_a_failing_request_ends_alone(start_server, tiny_model):
    srv = start_server("--model", tiny_model, "--no-engine-process", entry="tests.entrypoints.openai.faulty_server")
    try:
        srv.wait_ready()

        async def both() -> tuple[list[str], list[str]]:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60.0) as client:
                return await asyncio.gather(_stream(client, GOOD), _stream(client, BAD))

        good, bad = asyncio.run(both())
        assert bad[-1] == "data: [DONE]"
        error = json.loads(bad[-2][6:])["error"]
        assert error["type"] == "internal_error" and error["code"] == "internal_error"
        assert good[-1] == "data: [DONE]" and not any('"error"' in line for line in good)
        with httpx.Client(base_url=srv.base_url, timeout=60.0) as c:
            alone = c.post("/v1/completions", json=GOOD).json()["choices"][0]
            assert _text(good) == (alone["text"], "length")  # same tokens as without the fault
            failed = c.post("/v1/completions", json=BAD)
            assert failed.status_code == 500
            assert failed.json()["error"]["type"] == "internal_error"
            assert c.get("/health").status_code == 200
            metrics = c.get("/metrics").text
            assert ('vllm:request_success_total{engine="0",finished_reason="error",model_name="smol"} 2.0'
                    in metrics)
        assert srv.stop() == 0
        err = srv.proc.stderr.read()
        assert "injected sampling fault" in err  # the fault is logged with its cause
    finally:
        srv.kill()
