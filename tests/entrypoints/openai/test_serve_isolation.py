"""One tenant's request cannot hurt or observe another's: bad ids fail alone, salts split the cache."""
from __future__ import annotations

import json
import threading

import httpx

LONG_PROMPT = "Here is a long shared system prompt that many requests start with. " * 12


def test_out_of_vocab_stop_ids_fail_alone(server, http):
    """The request that once failed every in-flight request is now a 400 of its own."""
    lines: list[str] = []

    def stream() -> None:
        body = {"prompt": "Count:", "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines.extend(line for line in response.iter_lines() if line.startswith("data: "))

    worker = threading.Thread(target=stream)
    worker.start()
    for ids in ([999999], [2**63], [-1]):
        response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "min_tokens": 2,
                                                      "stop_token_ids": ids})
        assert response.status_code == 400 and response.json()["error"]["param"] == "stop_token_ids"
    worker.join(120)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] == "length" and "error" not in last


def _cached_tokens(http, salt: str | None) -> int:
    body = {"prompt": LONG_PROMPT + "Answer:", "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_salt_keeps_tenants_apart(http):
    _cached_tokens(http, "tenant-a")
    assert _cached_tokens(http, "tenant-a") > 0  # the same tenant hits its own blocks
    assert _cached_tokens(http, "tenant-b") == 0  # another tenant sees none of them
    assert _cached_tokens(http, None) == 0  # nor does a request without a salt


def test_chat_reports_cached_tokens(http):
    body = {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 1, "cache_salt": "c"}
    http.post("/v1/chat/completions", json=body)
    usage = http.post("/v1/chat/completions", json=body).json()["usage"]
    assert 0 < usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]


def test_tokenize_and_detokenize_need_the_key(server, http):
    for path, body in (("/tokenize", {"prompt": "Hi"}), ("/detokenize", {"tokens": [1]})):
        assert httpx.post(server.base_url + path, json=body).status_code == 401
        assert http.post(path, json=body).status_code == 200
