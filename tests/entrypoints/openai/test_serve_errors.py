"""Bad input gets an OpenAI-style error with the right status, and the server keeps serving."""
from __future__ import annotations

import httpx
import openai
import pytest


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("field, value, words", [
    ("top_p", 3.0, "(0, 1]"),
    ("temperature", -1.0, "non-negative"),
    ("n", 0, ">= 1"),
    ("logprobs", 30, "[0, 20]"),
    ("top_k", -5, "-1 (disabled)"),
    ("max_tokens", 0, "at least 1"),
    ("presence_penalty", 3.0, "[-2, 2]"),
    ("repetition_penalty", 0.0, "(0, 2]"),
])
def test_invalid_parameter_is_400_naming_it(http, field, value, words):
    error = _error(http.post("/v1/completions", json={"prompt": "Hi", field: value}), 400)
    assert error["param"] == field
    assert field in error["message"] and words in error["message"]


def test_chat_max_completion_tokens_named(http):
    error = _error(http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 0}), 400)
    assert error["param"] == "max_completion_tokens"


def test_too_long_prompt_states_length_and_limit(http):
    tokens = list(range(100, 700))
    error = _error(http.post("/v1/completions", json={"prompt": tokens, "max_tokens": 2}), 400)
    assert "600" in error["message"] and "512" in error["message"] and error["param"] == "prompt"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-9", prompt="Hi", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("body", [b'{"prompt": "Hi",', b"not json", b'{"max_tokens": 3}',
                                  b'{"prompt": "Hi", "max_tokens": "many"}', b'{"prompt": []}',
                                  b'{"prompt": "Hi", "stream_options": 3}'])
def test_malformed_body_is_400_not_422(http, body):
    response = http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    _error(response, 400)


def test_schema_error_names_the_field(http):
    error = _error(http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": "many"}), 400)
    assert error["param"] == "max_tokens"


def test_chat_errors(http):
    _error(http.post("/v1/chat/completions", json={"messages": []}), 400)
    error = _error(http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}), 400)
    assert error["param"] == "top_logprobs"


def test_detokenize_rejects_bad_ids(http):
    assert _error(http.post("/detokenize", json={"tokens": [-1]}), 400)["param"] == "tokens"


def test_api_key_required_on_v1(server, http):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "Hi"}, headers=headers)
        assert _error(response, 401)["type"] == "authentication_error"
    assert httpx.get(f"{server.base_url}/v1/models").status_code == 401
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(f"{server.base_url}/health").status_code == 200  # only /v1/* is guarded


def test_server_still_serves_after_errors(client):
    response = client.completions.create(model="smol", prompt="Hi", max_tokens=2, temperature=0)
    assert response.usage.completion_tokens == 2
