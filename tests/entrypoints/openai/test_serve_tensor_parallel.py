"""`folovllm serve --tensor-parallel-size 2`: the engine-core process owns rank 0 and spawns rank 1;
a request is answered, and killing a rank ends the server (exit 1) with no process left behind."""
from __future__ import annotations

import signal

import httpx
import psutil

from tests.entrypoints.openai.conftest import MODEL_NAME, ServerProcess

RANK_MAIN = "folovllm.worker.rank_main"


def _ranks_of(server: ServerProcess) -> list[psutil.Process]:
    return [p for p in psutil.Process(server.proc.pid).children(recursive=True)
            if RANK_MAIN in " ".join(p.cmdline())]


def test_server_with_two_ranks_answers_then_a_killed_rank_ends_it(tiny_model: str) -> None:
    server = ServerProcess("--model", tiny_model, "--tensor-parallel-size", "2")
    try:
        server.wait_ready(timeout_s=300)
        response = httpx.post(f"{server.base_url}/v1/completions", timeout=120, json={
            "model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4
        ranks = _ranks_of(server)
        assert len(ranks) == 1
        ranks[0].send_signal(signal.SIGKILL)
        assert server.proc.wait(120) == 1  # the idle engine notices, exits; the server follows
        gone, alive = psutil.wait_procs(ranks, timeout=30)
        assert not alive
        assert "tensor-parallel rank 1" in server.proc.stderr.read()
    finally:
        server.kill()
