"""`folovllm serve --data-parallel-size 2`: two engine-core replicas behind one server answer as one
engine would (greedy outputs), both serve requests (per-engine /metrics), a shared prefix stays on one
replica, streams and aborts work, and a killed replica ends the server (exit 1)."""
from __future__ import annotations

import signal
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from folovllm import LLM, SamplingParams
from tests.entrypoints.openai.conftest import MODEL_NAME, ServerProcess

PROMPTS = [f"Request number {i} asks about {topic}:" for i, topic in
           enumerate(["rivers", "mountains", "the sea", "bread", "clocks", "music", "trees", "snow"])]


@pytest.fixture(scope="module")
def server(tiny_model: str):
    proc = ServerProcess("--model", tiny_model, "--data-parallel-size", "2", "--num-threads", "2")
    try:
        proc.wait_ready(timeout_s=300)
        yield proc
    finally:
        proc.stop()
        proc.kill()


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    import openai

    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def per_engine(server: ServerProcess) -> dict[str, dict[str, float]]:
    """/metrics as {sample name{other labels}: {engine: value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(httpx.get(f"{server.base_url}/metrics").text):
        for sample in family.samples:
            if "engine" not in sample.labels or family.name.endswith("cache_config_info"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("model_name", "engine"))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name][sample.labels["engine"]] = sample.value
    return values


def _completed(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
    return metrics["vllm:request_success_total{finished_reason=length}"]


def test_greedy_outputs_match_one_engine_and_both_replicas_serve(server, client, tiny_model) -> None:
    def complete(prompt: str) -> str:
        return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        served = list(pool.map(complete, PROMPTS))
    offline = LLM(tiny_model, dtype="float32", max_model_len=512, kv_cache_memory="256MiB", seed=0,
                  num_threads=1)  # one engine: what each replica is
    expected = [out.outputs[0].text for out in offline.generate(
        PROMPTS, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)]
    assert served == expected
    completed = _completed(per_engine(server))
    assert set(completed) == {"0", "1"} and all(count > 0 for count in completed.values()), completed
    assert sum(completed.values()) == len(PROMPTS)
    info = httpx.get(f"{server.base_url}/metrics").text
    assert 'engine="0"' in info and 'engine="1"' in info and "cache_config_info" in info
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/load").json() == {"server_load": 0}


def test_requests_sharing_a_prefix_land_on_one_replica(server, client) -> None:
    shared = "A long shared preamble that every request in this test starts with, " * 4
    before = _completed(per_engine(server))
    for i in range(4):  # one at a time: with idle replicas, only the prefix keeps them together
        client.completions.create(model=MODEL_NAME, prompt=f"{shared} question {i}?", max_tokens=2,
                                  temperature=0, extra_body={"ignore_eos": True})
    after = per_engine(server)
    gained = {engine: after_count - before.get(engine, 0) for engine, after_count in _completed(after).items()}
    assert sorted(gained.values()) == [0, 4], gained
    holder = next(engine for engine, count in gained.items() if count == 4)
    assert after["vllm:prompt_tokens_cached_total"][holder] > 0


def test_streams_and_aborts_free_their_replica(server, client) -> None:
    body = {"model": MODEL_NAME, "prompt": "Tell a long story:", "max_tokens": 400, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.base_url, timeout=60.0) as c:
        with c.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            for _ in range(4):  # a few tokens in, then the client goes away
                next(lines)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        running = per_engine(server)["vllm:num_requests_running"]
        if sum(running.values()) == 0:
            break
        time.sleep(0.1)
    metrics = per_engine(server)
    assert sum(metrics["vllm:num_requests_running"].values()) == 0
    assert sum(metrics["vllm:request_success_total{finished_reason=abort}"].values()) == 1
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="After the abort:", max_tokens=3,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)


def test_a_killed_replica_ends_the_server(server) -> None:
    """Last in this module: it ends the shared server."""
    engines = [p for p in psutil.Process(server.proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(engines) == 2, [p.cmdline() for p in engines]
    engines[1].send_signal(signal.SIGKILL)
    assert server.proc.wait(120) == 1
    gone, alive = psutil.wait_procs(engines, timeout=30)
    assert not alive
    assert "data-parallel engine" in server.proc.stderr.read()
