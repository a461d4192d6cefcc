"""A live `folovllm serve` subprocess on a free port, shared by the module tests."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from folovllm.bench.serve_client import wait_for_health

API_KEY = "test-key"
MODEL_NAME = "smol"
# Same engine settings as the offline `smol_llm` fixture, so greedy outputs can be compared.
ENGINE_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--kv-cache-memory", "256MiB",
               "--seed", "0"]


class ServerProcess:
    """A server subprocess; ``stop()`` sends SIGTERM and returns the exit code. ``entry`` is the
    module run with ``-m`` (a test's own wrapper of the CLI, e.g. one that injects a fault);
    ``https`` when the extra args give it a certificate (readiness is then checked without
    verifying it)."""

    def __init__(self, *extra_args: str, entry: str = "folovllm.entrypoints.cli", https: bool = False) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.base_url = f"{'https' if https else 'http'}://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", entry, "serve", "--port", str(self.port),
               "--served-model-name", MODEL_NAME, "--log-level", "warning", *ENGINE_ARGS, *extra_args]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "FOLOVLLM_API_KEY": ""},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        if not wait_for_health(self.base_url, timeout_s, self.check_running, request_timeout_s=1.0, verify=False):
            self.kill()
            raise RuntimeError("server did not become healthy in time")

    def check_running(self) -> None:
        """RuntimeError with the server's stderr once it has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.proc.stderr.read()}")

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def running_server(*extra_args: str) -> Iterator[ServerProcess]:
    """A ``folovllm serve`` with ``extra_args``, ready inside the block, stopped (killed if need be) after it."""
    proc = ServerProcess(*extra_args)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
        proc.kill()


@pytest.fixture(scope="session")
def server():
    """The shared server: API key on, default admission queue, cached_tokens in usage."""
    with running_server("--api-key", API_KEY, "--enable-prompt-tokens-details") as proc:
        yield proc


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="session")
def http(server):
    """A raw HTTP client with the API key, for what the openai client hides (status, headers)."""
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=60.0) as c:
        yield c


@pytest.fixture(scope="session")
def start_server():
    """Starts an extra server (own settings); the test stops it."""
    return ServerProcess


@pytest.fixture(scope="session")
def scrape(http):
    """Reads /metrics of the shared server."""
    return lambda: parse_metrics(http.get("/metrics"))


def load(metrics: dict[str, float]) -> tuple[float, float, float]:
    """(requests running, requests waiting, KV cache usage): (0, 0, 0) when the server is idle."""
    return (metrics["vllm:num_requests_running"], metrics["vllm:num_requests_waiting"],
            metrics["vllm:kv_cache_usage_perc"])


def wait_idle(scrape: Callable[[], dict[str, float]], timeout_s: float = 30.0) -> dict[str, float]:
    """/metrics once the server is idle (``load``); past ``timeout_s``, the last scrape as it stands."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = scrape()
        if load(now) == (0, 0, 0) or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def parse_metrics(response: httpx.Response) -> dict[str, float]:
    """/metrics as {sample name{sorted labels, model_name and engine dropped}: value summed over those};
    must parse."""
    from prometheus_client.parser import text_string_to_metric_families

    assert response.status_code == 200
    values = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("model_name", "engine"))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            values[key] = values.get(key, 0.0) + sample.value  # summed over engine replicas, as Prometheus sums
    return values
