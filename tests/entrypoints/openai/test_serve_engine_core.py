"""Where the engine core runs: its own process (default) or a server thread, same answers; a dead
engine process fails requests with a clear error instead of hanging them, and the server exits.
Plumbing, not numerics: the servers run the tiny random model, which starts in a fraction of the
default model's time."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil

from tests.entrypoints.openai.conftest import MODEL_NAME


def _engine_processes(server_pid: int) -> list[psutil.Process]:
    """The server's spawned children, less multiprocessing's resource tracker."""
    return [p for p in psutil.Process(server_pid).children()
            if any("spawn_main" in part for part in p.cmdline())]


PROMPT = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}


def test_engine_thread_gives_the_same_text_as_engine_process(start_server, tiny_model):
    from folovllm import LLM, SamplingParams

    # the offline engine runs in this process, as the server's engine thread does
    offline = LLM(tiny_model, dtype="float32", max_model_len=512, kv_cache_memory="256MiB", seed=0)
    expected = offline.generate([PROMPT["prompt"]], SamplingParams(temperature=0, max_tokens=PROMPT["max_tokens"]),
                                use_tqdm=False)[0].outputs[0].text
    srv = start_server("--model", tiny_model, "--no-engine-process")
    try:
        srv.wait_ready()
        with httpx.Client(base_url=srv.base_url, timeout=60.0) as c:
            assert _engine_processes(srv.proc.pid) == []
            assert c.post("/v1/completions", json=PROMPT).json()["choices"][0]["text"] == expected
        assert srv.stop() == 0
    finally:
        srv.kill()


def test_dead_engine_process_fails_requests_and_the_server_exits(start_server, tiny_model):
    """In-flight requests get a 500 engine_dead error (a stream: error event, then [DONE]), /health
    turns 503, the death is logged with its cause, and the server exits non-zero for a supervisor."""
    srv = start_server("--model", tiny_model)
    try:
        srv.wait_ready()
        [engine] = _engine_processes(srv.proc.pid)
        with httpx.Client(base_url=srv.base_url, timeout=60.0) as c, ThreadPoolExecutor(1) as pool:
            assert c.post("/v1/completions", json=PROMPT).status_code == 200
            body = {**PROMPT, "max_tokens": 400, "ignore_eos": True}
            plain = pool.submit(httpx.post, f"{srv.base_url}/v1/completions", json=body, timeout=60.0)
            with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
                lines = stream.iter_lines()
                assert next(lines).startswith("data: ")  # the request is running
                engine.kill()
                rest = [line for line in lines if line]  # the stream ends, it does not hang
            health = [c.get("/health").status_code for _ in range(3)]
            response = plain.result(timeout=30)
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2][6:])["error"]
        assert error["code"] == "engine_dead" and "engine" in error["message"], error
        assert response.status_code == 500, response.text
        assert response.json()["error"]["code"] == "engine_dead"
        assert 503 in health or srv.proc.poll() is not None
        assert srv.proc.wait(30) == 1
        err = srv.proc.stderr.read()
        assert "engine process died (killed by SIGKILL)" in err, err
    finally:
        srv.kill()


def test_bad_engine_setting_exits_2_with_the_reason(start_server, tiny_model):
    """The engine process finds the bad setting; the server prints it once and exits 2."""
    srv = start_server("--model", tiny_model, "--max-model-len", "999999")
    try:
        assert srv.proc.wait(120) == 2
        err = srv.proc.stderr.read()
        assert "error: max_model_len=999999 exceeds the model's maximum" in err
        assert "Traceback" not in err
    finally:
        srv.kill()
