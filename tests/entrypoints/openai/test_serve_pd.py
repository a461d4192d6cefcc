"""PD disaggregation over HTTP: a producer server and a consumer server, called as the proxy calls
them (P with max_tokens 1 and do_remote_decode, then D with the params P returned), give the output
of a colocated server, streaming included; P's KV comes back to where it started."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import API_KEY, ServerProcess

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def pd_servers():
    producer, consumer = ServerProcess("--kv-role", "producer"), ServerProcess("--kv-role", "consumer")
    try:
        producer.wait_ready(300.0)
        consumer.wait_ready(300.0)
        yield producer, consumer
    finally:
        for proc in (producer, consumer):
            proc.stop()
            proc.kill()


def kv_usage(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("vllm:kv_cache_usage_perc{")))


def via_pd(producer, consumer, path: str, body: dict, request_id: str) -> httpx.Response:
    prefill = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    if "messages" in body:
        prefill["max_completion_tokens"] = 1
    headers = {"X-Request-Id": request_id}
    answer = httpx.post(f"{producer.base_url}{path}", json=prefill, headers=headers, timeout=60).json()
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True
    return httpx.post(f"{consumer.base_url}{path}", json={**body, "kv_transfer_params": params},
                      headers=headers, timeout=60)


@pytest.mark.slow  # two more server starts; test_pd_end_to_end.py covers PD through the proxy by default
def test_pd_matches_colocated(server, pd_servers):
    producer, consumer = pd_servers
    start = kv_usage(producer.base_url)
    body = {"model": "smol", "prompt": "The capital of France is a city that", "max_tokens": 12,
            "temperature": 0}
    want = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=HEADERS, timeout=60).json()
    got = via_pd(producer, consumer, "/v1/completions", body, "pd-1").json()
    assert got["choices"][0]["text"] == want["choices"][0]["text"]

    chat = {"model": "smol", "messages": [{"role": "user", "content": "Name three colors."}],
            "max_tokens": 10, "temperature": 0}
    want = httpx.post(f"{server.base_url}/v1/chat/completions", json=chat, headers=HEADERS, timeout=60).json()
    streamed = via_pd(producer, consumer, "/v1/chat/completions", {**chat, "stream": True}, "pd-2")
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == want["choices"][0]["message"]["content"]

    metrics = httpx.get(f"{consumer.base_url}/metrics").text
    external = next(line for line in metrics.splitlines()
                    if line.startswith("vllm:prompt_tokens_by_source_total") and "external_kv_transfer" in line)
    assert float(external.split()[-1]) > 0
    received = next(line for line in metrics.splitlines() if line.startswith("vllm:kv_transfer_recv_bytes_total{"))
    assert float(received.split()[-1]) > 0  # both requests' KV, counted where it arrived
    deadline = time.monotonic() + 10
    while kv_usage(producer.base_url) != start and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kv_usage(producer.base_url) == start


def test_kv_transfer_params_need_a_kv_role(server):
    body = {"model": "smol", "prompt": "Hi", "max_tokens": 2, "kv_transfer_params": {"do_remote_decode": True}}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=HEADERS, timeout=60)
    assert response.status_code == 400 and "--kv-role" in response.text
