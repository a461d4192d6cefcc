"""What makes the server a vLLM drop-in at its front door: probe endpoints, SageMaker's
/invocations, /load, request ids, CORS, model aliases and the frontend flags."""
from __future__ import annotations

import subprocess
import threading
import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import API_KEY, MODEL_NAME

PROMPT = "The capital of France is"


def test_version_ping_and_load(server, http):
    assert isinstance(http.get("/version").json()["version"], str)
    assert http.get("/ping").status_code == 200
    assert http.post("/ping").status_code == 200
    assert http.get("/load").json() == {"server_load": 0}
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 32, "ignore_eos": True}
    request = threading.Thread(target=http.post, args=("/v1/completions",),
                               kwargs={"json": body, "timeout": 600.0})
    request.start()
    seen = set()
    while request.is_alive() and 1 not in seen:
        seen.add(http.get("/load").json()["server_load"])
        time.sleep(0.02)  # poll, leaving the CPU to the request
    request.join()
    assert 1 in seen  # the request counted while it ran
    assert http.get("/load").json() == {"server_load": 0}


def test_invocations_routes_by_body_shape(http):
    completion = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    assert http.post("/invocations", json=completion).json()["object"] == "text_completion"
    assert http.post("/invocations", json=chat).json()["object"] == "chat.completion"
    assert (http.post("/invocations", json=completion).json()["choices"][0]["text"]
            == http.post("/v1/completions", json=completion).json()["choices"][0]["text"])
    neither = http.post("/invocations", json={"input": "Hi"})
    assert neither.status_code == 400 and "messages" in neither.json()["error"]["message"]
    bad = http.post("/invocations", json={**completion, "temperature": "hot"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"


def test_request_id_header_is_used_and_echoed(http):
    body = {"prompt": PROMPT, "max_tokens": 2}
    given = http.post("/v1/completions", json=body, headers={"X-Request-Id": "trace-42"})
    assert given.headers["x-request-id"] == "trace-42"
    assert given.json()["id"] == "cmpl-trace-42"
    made = http.post("/v1/completions", json=body)
    assert made.json()["id"] == f"cmpl-{made.headers['x-request-id']}"
    assert http.get("/nothing", headers={"X-Request-Id": "e1"}).headers["x-request-id"] == "e1"
    too_long = http.post("/v1/completions", json=body, headers={"X-Request-Id": "x" * 300})
    assert too_long.status_code == 400


def test_cors_preflight_with_vllms_defaults(server):
    preflight = httpx.options(f"{server.base_url}/v1/chat/completions", headers={
        "Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "POST" in preflight.headers["access-control-allow-methods"]


def test_empty_or_omitted_model_is_the_served_model(http):
    for body in ({"model": "", "prompt": PROMPT, "max_tokens": 2}, {"prompt": PROMPT, "max_tokens": 2}):
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200 and response.json()["model"] == MODEL_NAME


def test_responses_api_matches_chat(client):
    chat = client.chat.completions.create(
        model=MODEL_NAME, max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}])
    response = client.responses.create(model=MODEL_NAME, instructions="Be brief.", input="Name a color.",
                                       max_output_tokens=12, temperature=0)
    assert response.output_text == chat.choices[0].message.content
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    as_list = client.responses.create(
        model=MODEL_NAME, max_output_tokens=12, temperature=0,
        input=[{"role": "system", "content": "Be brief."},
               {"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}])
    assert as_list.output_text == response.output_text


def test_responses_stream_events(client):
    deltas, kinds = [], []
    with client.responses.stream(model=MODEL_NAME, input="Count: one, two,", max_output_tokens=8,
                                 temperature=0) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == "response.completed"  # its status says whether max_output_tokens cut it
    assert "".join(deltas) == final.output_text and final.output_text


@pytest.fixture(scope="module")
def tls_server(start_server, tmp_path_factory, tiny_model):
    """One server with every frontend flag set away from its default, over HTTPS, on the tiny random
    model (the flags are plumbing: real weights would only slow its start)."""
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    srv = start_server("--model", tiny_model, "--served-model-name", "first", "alias",
                       "--metrics-prefix", "folovllm", "--root-path", "/api",
                       "--ssl-keyfile", str(key), "--ssl-certfile", str(cert),
                       "--allowed-origins", '["https://app.example"]', "--allow-credentials",
                       "--uvicorn-log-level", "warning", "--log-level", "info", "--enable-log-requests",
                       "--no-engine-process", https=True)
    stderr: list[str] = []
    try:
        srv.wait_ready()
        # drain stderr as it comes: info logging must not fill the pipe
        reader = threading.Thread(target=lambda: stderr.extend(srv.proc.stderr), daemon=True)
        reader.start()
        with httpx.Client(base_url=srv.base_url, verify=False, timeout=60.0) as c:
            yield c, srv, reader, stderr
    finally:
        srv.stop()
        srv.kill()


def test_frontend_flags(tls_server):
    c, srv, reader, stderr = tls_server
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["first", "alias"]
    assert c.get("/api/v1/models").status_code == 200  # behind a proxy that keeps the prefix
    body = {"model": "alias", "prompt": PROMPT, "max_tokens": 2}
    response = c.post("/v1/completions", json=body).json()
    assert response["model"] == "first"  # any alias is accepted; the first name is reported
    assert response["usage"]["prompt_tokens_details"] is None  # --enable-prompt-tokens-details is off
    metrics = c.get("/metrics").text
    assert "folovllm:request_success_total{" in metrics and "folovllm:request_rejected" in metrics
    assert "vllm:" not in metrics.replace("folovllm:", "")
    allowed = c.options("/v1/completions", headers={"Origin": "https://app.example",
                                                     "Access-Control-Request-Method": "POST"})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert allowed.headers["access-control-allow-credentials"] == "true"
    other = c.options("/v1/completions", headers={"Origin": "https://evil.example",
                                                   "Access-Control-Request-Method": "POST"})
    assert other.status_code == 400
    with pytest.raises(httpx.TransportError):  # TLS only
        httpx.get(srv.base_url.replace("https", "http") + "/health", timeout=5.0)
    # an idle TLS connection left open would hold the shutdown for asyncio's 30 s TLS-close timeout
    c.close()
    assert srv.stop() == 0
    reader.join(10.0)
    assert any(f"request {response['id']}" in line for line in stderr)  # --enable-log-requests


def test_api_key_still_guards_invocations(server):
    unauthorized = httpx.post(f"{server.base_url}/invocations", json={"prompt": PROMPT, "max_tokens": 2})
    assert unauthorized.status_code == 401
    assert httpx.get(f"{server.base_url}/ping").status_code == 200  # probes need no key
    assert API_KEY not in unauthorized.text
