"""Where the engine core runs: its own process (default) or a server thread, same answers; a dead
engine process turns /health to 503 and fails requests with a clear error instead of hanging them."""
from __future__ import annotations

import time

import httpx
import psutil

from tests.entrypoints.openai.conftest import MODEL_NAME

def _engine_processes(server_pid: int) -> list[psutil.Process]:
    """The server's spawned children, less multiprocessing's resource tracker."""
    return [p for p in psutil.Process(server_pid).children()
            if any("spawn_main" in part for part in p.cmdline())]


PROMPT = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}


def test_engine_thread_gives_the_same_text_as_engine_process(start_server, http):
    expected = http.post("/v1/completions", json=PROMPT).json()["choices"][0]["text"]
    srv = start_server("--no-engine-process")
    try:
        srv.wait_ready()
        with httpx.Client(base_url=srv.base_url, timeout=60.0) as c:
            assert _engine_processes(srv.proc.pid) == []
            assert c.post("/v1/completions", json=PROMPT).json()["choices"][0]["text"] == expected
        assert srv.stop() == 0
    finally:
        srv.kill()


def test_dead_engine_process_fails_requests_and_health(start_server):
    srv = start_server()
    try:
        srv.wait_ready()
        [engine] = _engine_processes(srv.proc.pid)
        with httpx.Client(base_url=srv.base_url, timeout=60.0) as c:
            assert c.post("/v1/completions", json=PROMPT).status_code == 200
            body = {**PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
            with c.stream("POST", "/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                assert next(lines).startswith("data: ")  # the request is running
                engine.kill()
                rest = list(lines)  # the stream ends (with an error event), it does not hang
            assert any('"error"' in line for line in rest), rest
            deadline = time.monotonic() + 10
            while c.get("/health").status_code != 503:
                assert time.monotonic() < deadline, "/health still 200 after the engine died"
                time.sleep(0.1)
            after = c.post("/v1/completions", json=PROMPT)
            assert after.status_code == 503, after.text
            assert "engine" in after.json()["error"]["message"]
        srv.stop()
    finally:
        srv.kill()


def test_bad_engine_setting_exits_2_with_the_reason(start_server):
    """The engine process finds the bad setting; the server prints it once and exits 2."""
    srv = start_server("--max-model-len", "999999")
    try:
        assert srv.proc.wait(120) == 2
        err = srv.proc.stderr.read()
        assert "error: max_model_len=999999 exceeds the model's maximum" in err
        assert "Traceback" not in err
    finally:
        srv.kill()
