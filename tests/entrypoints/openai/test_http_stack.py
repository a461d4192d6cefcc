"""--uvicorn-http / --uvicorn-loop: a missing C implementation is a clear error, and on either
stack (C: httptools + uvloop, pure Python: h11 + asyncio) the server streams what it returns whole."""
from __future__ import annotations

import json

import httpx
import pytest

from folovllm.entrypoints.openai import http_stack
from folovllm.entrypoints.openai.http_stack import check_http_stack, describe_http_stack
from tests.entrypoints.openai.conftest import MODEL_NAME


def test_missing_c_implementation_names_the_package(monkeypatch):
    monkeypatch.setattr(http_stack, "_installed", lambda package: False)
    with pytest.raises(ValueError, match="pip install httptools"):
        check_http_stack("httptools", "auto")
    with pytest.raises(ValueError, match="pip install uvloop"):
        check_http_stack("auto", "uvloop")
    check_http_stack("auto", "auto")  # auto falls back to the pure-Python ones
    check_http_stack("h11", "asyncio")
    assert describe_http_stack("auto", "auto") == "h11 + asyncio"


def test_auto_takes_the_c_implementations_when_installed(monkeypatch):
    monkeypatch.setattr(http_stack, "_installed", lambda package: True)
    assert describe_http_stack("auto", "auto") == "httptools + uvloop"
    assert describe_http_stack("h11", "asyncio") == "h11 + asyncio"


@pytest.mark.parametrize("http,loop", [("httptools", "uvloop"), pytest.param("h11", "asyncio", marks=pytest.mark.slow)])
def test_stack_streams_what_it_returns_whole(start_server, tiny_model, http, loop):
    for package in {http, loop} & {"httptools", "uvloop"}:
        pytest.importorskip(package, reason=f"{package} is not installed (pip install {package})")
    srv = start_server("--model", tiny_model, "--uvicorn-http", http, "--uvicorn-loop", loop)
    try:
        srv.wait_ready()
        body = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 24,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        with httpx.Client(base_url=srv.base_url, timeout=120.0) as c:
            whole = c.post("/v1/completions", json=body).json()["choices"][0]
            text, token_ids = "", []
            with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            text += choice["text"]
                            token_ids += choice["token_ids"]
        assert len(whole["token_ids"]) == 24
        assert (text, token_ids) == (whole["text"], whole["token_ids"])
        assert srv.stop() == 0  # SIGTERM drains on either loop
    finally:
        srv.kill()
