"""Every case of the bad-input corpus gets its 4xx with an OpenAI error body (Anthropic's on the Messages
API's paths), and nothing else breaks: the server stays healthy after each, and a stream running through
the whole corpus ends normally."""
from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from tests.entrypoints.openai.bad_inputs import CASES

API_KEY = "test-key"  # the shared server's key (conftest.py)

# A non-ASCII header value goes out as raw bytes (httpx would refuse to encode the str).
_RAW_HEADERS = {"Bearer kéy-ü": "Bearer kéy-ü".encode()}


def _send(http: httpx.Client, method: str, path: str, body, headers: dict) -> httpx.Response:
    headers = {k: _RAW_HEADERS.get(v, v) for k, v in headers.items()}
    if "Authorization" not in headers:
        headers["Authorization"] = f"Bearer {API_KEY}"
    elif not headers["Authorization"]:
        del headers["Authorization"]
        return http.request(method, path, content=_encode(body), headers=headers,
                            auth=_NoAuth())
    return http.request(method, path, content=_encode(body), headers=headers)


class _NoAuth(httpx.Auth):
    def auth_flow(self, request):
        request.headers.pop("Authorization", None)
        yield request


def _encode(body) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    return json.dumps(body).encode()


def test_corpus_is_large_and_named_uniquely():
    names = [c[0] for c in CASES]
    assert len(names) >= 150 and len(set(names)) == len(names)


@pytest.fixture(scope="module")
def background_stream(server):
    """A long greedy stream that runs while the corpus is thrown at the server."""
    result: dict = {}

    def run() -> None:
        body = {"model": "smol", "prompt": "Count:", "max_tokens": 120, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=300,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as response:
            result["status"] = response.status_code
            result["lines"] = [line for line in response.iter_lines() if line.startswith("data: ")]

    thread = threading.Thread(target=run)
    thread.start()
    yield thread, result
    thread.join(300)


@pytest.mark.parametrize("name, method, path, body, headers, status", CASES, ids=[c[0] for c in CASES])
def test_bad_input(server, background_stream, name, method, path, body, headers, status):
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        response = _send(http, method, path, body, headers)
        assert response.status_code == status, response.text[:500]
        body = response.json()
        if path.startswith("/v1/messages"):
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"]
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_the_stream_beside_the_corpus_was_undisturbed(server, background_stream, client):
    thread, result = background_stream
    thread.join(300)
    assert result["status"] == 200 and result["lines"][-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in result["lines"][:-1]]
    assert all("error" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    response = client.completions.create(model="smol", prompt="Hi", max_tokens=2, temperature=0)
    assert response.usage.completion_tokens == 2


def test_a_declared_length_over_the_limit_is_refused_unread(server):
    """A Content-Length over the limit gets its 413 before the server waits for that many bytes."""
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 999999999\r\n\r\n{}")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        reply = _read_reply(sock)
    assert reply.startswith("HTTP/1.1 413") and '"code":"request_too_large"' in reply


def _read_reply(sock: socket.socket) -> str:
    """Read one HTTP reply whole: headers and body may arrive in separate segments."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()
