"""A live ``folovllm serve`` for the simulator's calibration and fidelity runs (scripts/sim_calibrate.py,
scripts/sim_fidelity.py): started as its own process on a free port, probed for machine speed, its step
trace read back by time window. The server runs as a command, so nothing of the engine is imported here."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from folovllm.simulator.speed import PROBE_OUTPUT_LEN, PROBE_PROMPT_LEN, PROBE_REQUESTS

PROFILE = Path(__file__).resolve().parent / "profiles" / "cpu-smollm2-135m.json"
CLI = [sys.executable, "-m", "folovllm.entrypoints.cli"]


def start_server(max_model_len: int, trace: Path | None = None,
                 serve_args: list[str] | None = None) -> tuple[subprocess.Popen, int]:
    """``folovllm serve`` on a free port (with ``trace``: writing its step trace there; ``serve_args``: more
    of its options); waits for /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    traced = ["--trace", str(trace)] if trace is not None else []
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--max-model-len", str(max_model_len),
                             "--log-level", "warning", *traced, *(serve_args or [])],
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, port
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("folovllm serve did not start")


def send_probe(port: int, seed: int) -> list[float]:
    """The machine-speed probe (folovllm/simulator/speed.py): ``PROBE_REQUESTS`` lone fresh prompts, one after
    another; returns its window (perf_counter, shared with the server's step trace)."""
    rng = np.random.default_rng(1_000_000 + seed)  # fresh ids each probe: no prefix-cache hit
    started = time.perf_counter()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        for _ in range(PROBE_REQUESTS):
            prompt = [int(t) for t in rng.integers(1000, 30000, size=PROBE_PROMPT_LEN)]
            http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": PROBE_OUTPUT_LEN,
                                               "temperature": 0.0, "ignore_eos": True}).raise_for_status()
    return [started, time.perf_counter()]


def threads_args(num_threads: int | None) -> list[str]:
    return [] if num_threads is None else ["--num-threads", str(num_threads)]


def steps_between(trace: Path, start: float, end: float) -> list[dict]:
    """The steps of the step trace ``trace`` that ended between ``start`` and ``end`` (perf_counter)."""
    with open(trace, encoding="utf-8") as f:
        return [r for line in f if line.strip() and start <= (r := json.loads(line))["time"] <= end]
