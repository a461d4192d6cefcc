"""/metrics parses, moves with traffic, and shows a disconnected stream's blocks freed."""
from __future__ import annotations

import time

import httpx

PROMPT = "Metrics are counted for this unique prompt number 4711:"


def test_metrics_parse_and_counters_move(client, scrape):
    before = scrape()
    for name in ("folovllm:num_requests_running", "folovllm:num_requests_waiting",
                 "folovllm:kv_cache_usage_perc", "folovllm:num_preemptions_total",
                 "folovllm:prefix_cache_queries_total", "folovllm:prefix_cache_hits_total",
                 "folovllm:iteration_tokens_total_count"):
        assert name in before, name
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True})
    after = scrape()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("folovllm:generation_tokens_total") == 5
    assert 0 < delta("folovllm:prompt_tokens_total") <= response.usage.prompt_tokens
    assert delta("folovllm:request_success_total{finished_reason=length}") == 1
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                      "request_queue_time_seconds"):
        assert delta(f"folovllm:{histogram}_count") == 1, histogram
    assert delta("folovllm:inter_token_latency_seconds_count") == 4
    assert delta("folovllm:iteration_tokens_total_count") >= 5
    assert after["folovllm:num_requests_running"] == 0


def test_disconnect_mid_stream_frees_blocks(server, scrape):
    before = scrape()
    body = {"model": "smol", "prompt": "Tell a long story:", "max_tokens": 400, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.base_url, timeout=30.0,
                      headers={"Authorization": "Bearer test-key"}) as c:
        with c.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            for _ in range(4):  # a few tokens in: the request holds KV blocks now
                next(lines)
            running = scrape()
            assert running["folovllm:num_requests_running"] == 1
            assert running["folovllm:kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        now = scrape()
        if now["folovllm:num_requests_running"] == 0:
            break
        time.sleep(0.05)
    assert now["folovllm:num_requests_running"] == 0
    assert now["folovllm:kv_cache_usage_perc"] == 0
    aborted = "folovllm:request_success_total{finished_reason=abort}"
    assert now.get(aborted, 0) - before.get(aborted, 0) == 1
    assert now["folovllm:generation_tokens_total"] - before["folovllm:generation_tokens_total"] < 400
