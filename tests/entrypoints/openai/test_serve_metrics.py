"""/metrics parses, moves with traffic, and shows a disconnected stream's blocks freed."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import load, parse_metrics, wait_idle
from tests.entrypoints.openai.vllm_metrics import (
    EMITTED,
    GRAFANA_SERIES,
    NOT_EMITTED,
    OWN,
)

PROMPT = "Metrics are counted for this unique prompt number 4711:"


def test_metrics_parse_and_counters_move(client, scrape):
    before = scrape()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:iteration_tokens_total_count"):
        assert name in before, name
    response = client.completions.create(model="smol", prompt=PROMPT, max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True})
    after = scrape()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("vllm:generation_tokens_total") == 5
    assert 0 < delta("vllm:prompt_tokens_total") <= response.usage.prompt_tokens
    assert delta("vllm:request_success_total{finished_reason=length}") == 1
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                      "request_queue_time_seconds"):
        assert delta(f"vllm:{histogram}_count") == 1, histogram
    assert delta("vllm:inter_token_latency_seconds_count") == 4
    assert delta("vllm:time_per_output_token_seconds_count") == 4
    assert delta("vllm:iteration_tokens_total_count") >= 5
    assert after["vllm:num_requests_running"] == 0
    for histogram in ("request_prefill_time_seconds", "request_decode_time_seconds",
                      "request_inference_time_seconds", "request_time_per_output_token_seconds",
                      "request_params_n", "request_params_max_tokens", "request_max_num_generation_tokens"):
        assert delta(f"vllm:{histogram}_count") == 1, histogram
    assert delta("vllm:request_params_max_tokens_sum") == 5
    assert delta("vllm:request_generation_tokens_sum") == 5
    assert delta("vllm:request_prompt_tokens_sum") == response.usage.prompt_tokens
    cached = response.usage.prompt_tokens_details.cached_tokens
    assert delta("vllm:prompt_tokens_cached_total") == cached
    assert delta("vllm:request_prefill_kv_computed_tokens_sum") == response.usage.prompt_tokens - cached
    assert delta("vllm:prompt_tokens_by_source_total{source=local_compute}") == response.usage.prompt_tokens - cached
    # the phases add up: inference = prefill + decode, all inside the end-to-end latency
    phases = delta("vllm:request_prefill_time_seconds_sum") + delta("vllm:request_decode_time_seconds_sum")
    assert abs(delta("vllm:request_inference_time_seconds_sum") - phases) < 1e-6
    assert delta("vllm:request_inference_time_seconds_sum") <= delta("vllm:e2e_request_latency_seconds_sum")


def test_metric_names_and_types_match_vllms(http):
    """Every vLLM series we compute is there with vLLM's type and labels; none we do not compute;
    no _created series."""
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)
                if f.name.startswith("vllm:")}
    types = {name.removeprefix("vllm:"): f.type for name, f in families.items()}
    assert types == {**EMITTED, **OWN}
    assert not set(types) & set(NOT_EMITTED)
    for name, family in families.items():
        assert not any(s.name.endswith("_created") for s in family.samples), name
        if name.removeprefix("vllm:") in EMITTED:  # cache_config_info: its labels are the config's
            wanted = {"engine"} if name == "vllm:cache_config_info" else {"model_name", "engine"}
            assert all(wanted <= set(s.labels) for s in family.samples), name
    weights = families["vllm:model_weight_bytes"].samples[0]
    # 135M weights: the GGUF's packed codes and scales (half a byte a weight and more) where our kernel runs
    # them, dequantized to fp32 on a tier without it (4 bytes a weight, the LM head's copy of the embedding too)
    assert weights.labels["model_name"] == "smol" and 0.5 * 134e6 < weights.value < 5 * 134e6
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16" and info["enable_prefix_caching"] == "True"
    platform = next(f for f in text_string_to_metric_families(http.get("/metrics").text)
                    if f.name == "folovllm:platform_info").samples[0].labels
    assert platform["platform"] == "cpu" and platform["isa"] in ("none", "avx2", "avx512", "avx512_bf16", "amx")
    assert platform["allocator"] in ("tcmalloc", "system")
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error"}
    # vLLM's example Grafana dashboards find every series their queries name
    samples = {s.name for family in families.values() for s in family.samples}
    assert GRAFANA_SERIES - samples == set()


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
            assert running["vllm:num_requests_running"] == 1
            assert running["vllm:kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        now = scrape()
        if now["vllm:num_requests_running"] == 0:
            break
        time.sleep(0.05)
    assert now["vllm:num_requests_running"] == 0
    assert now["vllm:kv_cache_usage_perc"] == 0
    aborted = "vllm:request_success_total{finished_reason=abort}"
    assert now.get(aborted, 0) - before.get(aborted, 0) == 1
    assert now["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 400


def test_rejected_requests_are_counted_by_status(server, http, scrape):
    """Error responses given before a request reaches the engine count in request_rejected_total."""
    before = scrape()
    assert http.post("/v1/completions", json={"model": "smol", "prompt": "Hi", "top_p": 7}).status_code == 400
    assert http.post("/v1/completions", json={"model": "nope", "prompt": "Hi"}).status_code == 404
    assert http.get("/v1/nothing-here").status_code == 404
    no_key = httpx.post(f"{server.base_url}/v1/completions", json={"model": "smol", "prompt": "Hi"})
    assert no_key.status_code == 401
    assert http.get("/health").status_code == 200
    after = scrape()

    def delta(status: int) -> float:
        name = f"vllm:request_rejected_total{{status={status}}}"
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert (delta(400), delta(401), delta(404)) == (1, 1, 2)


@pytest.mark.slow  # 100 clients on a CPU model: tens of seconds
def test_disconnect_storm_leaves_no_blocks_or_requests(server, scrape):
    """Many streaming clients hang up mid-stream (or while queued): every request is aborted, every
    KV block comes back, and the server still answers."""
    import asyncio

    num_clients = 100
    before = scrape()
    body = {"model": "smol", "prompt": "Write a long poem about the sea:", "max_tokens": 300,
            "temperature": 0, "ignore_eos": True, "stream": True}

    async def hang_up(client: httpx.AsyncClient, index: int) -> None:
        async def read_first_chunk() -> None:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        return  # leaving the block closes the connection mid-stream
        if index % 2:
            try:  # odd clients give up early: some while their request is still being queued
                await asyncio.wait_for(read_first_chunk(), 0.05 * (index % 10))
            except asyncio.TimeoutError:
                pass
        else:
            await asyncio.wait_for(read_first_chunk(), 120)

    async def storm() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": "Bearer test-key"},
                                     limits=httpx.Limits(max_connections=num_clients), timeout=120) as client:
            await asyncio.gather(*(hang_up(client, i) for i in range(num_clients)))

    asyncio.run(storm())
    now = wait_idle(scrape)
    assert load(now) == (0, 0, 0)
    aborted = "vllm:request_success_total{finished_reason=abort}"
    assert now.get(aborted, 0) - before.get(aborted, 0) >= num_clients // 2
    with httpx.Client(base_url=server.base_url, headers={"Authorization": "Bearer test-key"},
                      timeout=60) as c:
        after = c.post("/v1/completions", json={**body, "stream": False, "max_tokens": 3})
        assert after.status_code == 200 and after.json()["choices"][0]["finish_reason"] == "length"


def test_gauges_reset_when_the_engine_is_gone():
    from folovllm.engine.core_loop import EngineSnapshot
    from folovllm.engine.stats import EngineStats
    from folovllm.entrypoints.openai.metrics import ServerMetrics

    metrics = ServerMetrics("smol")  # prefix vllm by default
    metrics.on_iteration(EngineSnapshot(EngineStats(), num_running=3, num_waiting=2, kv_usage=0.5), [], [])
    metrics.reset_gauges()
    values = parse_metrics(httpx.Response(200, content=metrics.render()))
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert values[f"vllm:{gauge}"] == 0, gauge
