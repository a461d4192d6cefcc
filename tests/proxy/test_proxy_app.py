"""The proxy between fake prefill and decode servers (uvicorn on free ports, in threads): the bodies
each side receives, the shared request id, streaming, errors, policies, disconnects, dead backends."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.proxy.fake_backends import free_port

COMPLETION = {"model": "m", "prompt": "Hello", "max_tokens": 5, "temperature": 0.0}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 5}


def sse_payloads(text: str) -> list:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    """Polls ``condition`` until true (another thread's server changes it), False past the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_prefill_gets_a_one_token_request_and_decode_the_producers_params(fakes, http):
    resp = http.post("/v1/completions", json={**COMPLETION, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    (p_got,), (d_got,) = fakes["p0"].behaviour.received, fakes["d0"].behaviour.received
    assert p_got.path == d_got.path == "/v1/completions"
    assert p_got.body == {**COMPLETION, "max_tokens": 1, "stream": False,
                          "kv_transfer_params": {"do_remote_decode": True}}
    request_id = p_got.headers["x-request-id"]
    params = {"remote_engine_id": "p0", "remote_block_ids": [3, 1, 4], "request_id": request_id}
    assert d_got.body == {**COMPLETION, "stream_options": {"include_usage": True}, "kv_transfer_params": params}
    assert resp.json()["kv_transfer_params_seen"] == params and resp.json()["served_by"] == "d0"


def test_chat_prefill_caps_both_token_fields(fakes, http):
    assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    (p_got,), (d_got,) = fakes["p0"].behaviour.received, fakes["d0"].behaviour.received
    assert p_got.path == d_got.path == "/v1/chat/completions"
    assert p_got.body["max_tokens"] == p_got.body["max_completion_tokens"] == 1
    assert d_got.body["max_completion_tokens"] == 5 and "max_tokens" not in d_got.body


def test_both_calls_carry_the_clients_request_id_and_it_comes_back(fakes, http):
    resp = http.post("/v1/completions", json=COMPLETION, headers={"X-Request-Id": "client-id-7",
                                                                  "Authorization": "Bearer k"})
    assert resp.headers["x-request-id"] == "client-id-7"
    for fake in ("p0", "d0"):
        (got,) = fakes[fake].behaviour.received
        assert got.headers["x-request-id"] == "client-id-7" and got.headers["authorization"] == "Bearer k"


def test_without_a_client_id_the_proxy_makes_one_shared_by_both_calls(fakes, http):
    resp = http.post("/v1/completions", json=COMPLETION)
    p_id = fakes["p0"].behaviour.received[0].headers["x-request-id"]
    assert p_id and p_id == fakes["d0"].behaviour.received[0].headers["x-request-id"] == resp.headers["x-request-id"]


def test_no_params_from_the_producer_means_none_to_the_consumer(fakes, http):
    fakes["p0"].behaviour.kv_params = False
    assert http.post("/v1/completions", json=COMPLETION).status_code == 200
    assert "kv_transfer_params" not in fakes["d0"].behaviour.received[0].body


@pytest.mark.parametrize("route,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_a_stream_passes_through_chunk_by_chunk(fakes, proxy, route, body):
    fakes["d0"].behaviour.num_chunks = 4
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        with client.stream("POST", route, json={**body, "stream": True}) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            payloads = sse_payloads(resp.read().decode())
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len(chunks) == 4 and all(c["served_by"] == "d0" for c in chunks)
    assert fakes["p0"].behaviour.received[0].body["stream"] is False
    assert fakes["d0"].behaviour.received[0].body["stream"] is True


def test_a_prefill_error_goes_back_as_is_and_decode_is_not_called(fakes, http):
    fakes["p0"].behaviour.error_status = 400
    resp = http.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert resp.status_code == 400 and resp.headers["retry-after"] == "7"
    assert resp.json() == {"error": {"message": "p0 refuses", "type": "invalid_request_error",
                                     "param": "prompt", "code": None}}
    assert fakes["d0"].behaviour.received == []


def test_a_decode_error_goes_back_as_is(fakes, http):
    fakes["d0"].behaviour.error_status = 503
    resp = http.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert resp.status_code == 503 and resp.json()["error"]["message"] == "d0 refuses"


def test_n_above_one_is_a_400_that_says_why_and_calls_nobody(fakes, http):
    resp = http.post("/v1/completions", json={**COMPLETION, "n": 2})
    assert resp.status_code == 400 and "n must be 1" in resp.json()["error"]["message"]
    assert resp.headers["x-request-id"]
    assert fakes["p0"].behaviour.received == [] and fakes["d0"].behaviour.received == []


def test_a_body_that_is_not_json_is_a_400(http):
    resp = http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]


def test_round_robin_alternates_in_each_pool(fakes, start_proxy):
    proxy = start_proxy([fakes["p0"].url, fakes["p1"].url], [fakes["d0"].url, fakes["d1"].url])
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        served = [client.post("/v1/completions", json=COMPLETION).json()["served_by"] for _ in range(4)]
    assert served == ["d0", "d1", "d0", "d1"]
    assert len(fakes["p0"].behaviour.received) == len(fakes["p1"].behaviour.received) == 2
    # each decode got the params of the producer that prefilled that request
    producers = [[r.body["kv_transfer_params"]["remote_engine_id"] for r in fakes[d].behaviour.received]
                 for d in ("d0", "d1")]
    assert producers == [["p0", "p0"], ["p1", "p1"]]


def test_least_loaded_sends_past_the_instance_with_a_stream_in_flight(fakes, start_proxy):
    proxy = start_proxy([fakes["p0"].url], [fakes["d0"].url, fakes["d1"].url], policy="least_loaded")
    for fake in ("d0", "d1"):
        fakes[fake].behaviour.num_chunks, fakes[fake].behaviour.chunk_delay_s = 200, 0.05
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        with client.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as first:
            lines = first.iter_lines()  # kept: dropping the iterator would close the stream
            busy = json.loads(sse_payloads(next(lines))[0])["served_by"]
            for fake in ("d0", "d1"):
                fakes[fake].behaviour.num_chunks = 2
            others = {client.post("/v1/completions", json=COMPLETION).json()["served_by"] for _ in range(3)}
            assert others == {"d1" if busy == "d0" else "d0"}
            assert sorted(b.in_flight for b in proxy.proxy.decode.backends) == [0, 1]
            fakes[busy].behaviour.chunk_delay_s = 0.0  # let the first stream finish now
            assert sse_payloads("\n".join(lines))[-1] == "[DONE]"
    assert wait_until(lambda: all(b.in_flight == 0 for b in proxy.proxy.decode.backends))


def test_a_client_that_leaves_mid_stream_closes_the_decode_stream(fakes, proxy):
    fakes["d0"].behaviour.num_chunks, fakes["d0"].behaviour.chunk_delay_s = 500, 0.02
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        with client.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
    assert fakes["d0"].behaviour.stream_closed_early.wait(timeout=10.0)
    assert wait_until(lambda: proxy.proxy.decode.backends[0].in_flight == 0)


def test_an_unreachable_backend_is_a_502_for_that_request_only(fakes, start_proxy):
    dead = f"http://127.0.0.1:{free_port()}"
    proxy = start_proxy([fakes["p0"].url], [dead, fakes["d0"].url])
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        failed = client.post("/v1/completions", json={**COMPLETION, "stream": True})
        served = client.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert failed.status_code == 502
    assert failed.json()["error"]["message"].startswith(f"the decode instance {dead} is unreachable")
    assert served.status_code == 200 and sse_payloads(served.text)[-1] == "[DONE]"
    # the stream's end reaches the client before the proxy's task releases its backend
    assert wait_until(lambda: all(b.in_flight == 0 for b in proxy.proxy.decode.backends))


def test_an_unreachable_prefill_is_a_502_and_decode_is_not_called(fakes, start_proxy):
    dead = f"http://127.0.0.1:{free_port()}"
    proxy = start_proxy([dead], [fakes["d0"].url])
    with httpx.Client(base_url=proxy.url, timeout=30.0) as client:
        resp = client.post("/v1/chat/completions", json=CHAT)
        health = client.get("/health")
    assert resp.status_code == 502 and f"the prefill instance {dead}" in resp.json()["error"]["message"]
    assert fakes["d0"].behaviour.received == []
    assert health.status_code == 503
    assert health.json()["prefill"][dead].startswith("unreachable")
    assert health.json()["decode"] == {fakes["d0"].url: "ok"}


def test_health_is_ok_when_every_backend_is_and_models_come_from_decode(http, fakes):
    health = http.get("/health")
    assert health.status_code == 200
    assert health.json() == {"prefill": {fakes["p0"].url: "ok"}, "decode": {fakes["d0"].url: "ok"}}
    assert http.get("/v1/models").json()["data"][0]["id"] == "model-of-d0"
