"""Prefill/decode disaggregation end to end: a producer and a consumer `folovllm serve` and a
`folovllm proxy` in front of them, all subprocesses on 127.0.0.1, against one colocated server.
Greedy output through the proxy (the official openai client; streamed too) must equal the
colocated server's, with the KV moved by ``shared_storage`` and by ``torch_distributed``.

Runs where ``folovllm serve`` has the KV transfer flags (``--kv-role``); skipped, saying so, before.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import pytest

from folovllm.bench.serve_client import wait_for_health
from folovllm.entrypoints.cli import build_parser
from tests.entrypoints.openai.conftest import MODEL_NAME, ServerProcess


def serve_knows(flag: str, value: str) -> bool:
    """Whether ``folovllm serve`` takes ``flag`` (the parser behind its --help)."""
    _, unknown = build_parser().parse_known_args(["serve", flag, value])
    return flag not in unknown


HAS_KV_ROLE = serve_knows("--kv-role", "producer")
pytestmark = pytest.mark.skipif(not HAS_KV_ROLE, reason="`folovllm serve` has no --kv-role here: the KV "
                                                         "connector (PD disaggregation) is not in this build")

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", [1000, 2000, 3000, 4000, 5000] * 8]
MESSAGES = [{"role": "user", "content": "Explain continuous batching in one sentence."}]
MAX_TOKENS = 24


class ProxyProcess:
    """`folovllm proxy` over one producer and one consumer."""

    def __init__(self, prefill_url: str, decode_url: str) -> None:
        from tests.proxy.fake_backends import free_port

        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "folovllm.entrypoints.cli", "proxy", "--prefill", prefill_url,
               "--decode", decode_url, "--port", str(self.port), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        if not wait_for_health(self.base_url, timeout_s, self.check_running):
            raise RuntimeError("the proxy did not report every backend healthy in time")

    def check_running(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the proxy exited with {self.proc.returncode}:\n{self.proc.stderr.read()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def connector_args(connector: str, role: str, storage: str) -> list[str]:
    args = ["--kv-role", role, "--kv-connector", connector]
    if connector == "shared_storage":
        args += ["--kv-transfer-config", json.dumps({"kv_connector_extra_config": {"shared_storage_path": storage}})]
    return args


# (connector, model): by default one connector on the tiny random model (the test is about moving
# the KV, which a wrong transfer breaks on any weights); the second connector (three more processes)
# and the real weights run with the slow tests
SETUPS = [("shared_storage", "tiny"),
          pytest.param(("torch_distributed", "tiny"), marks=pytest.mark.slow),
          pytest.param(("shared_storage", "default"), marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=SETUPS, ids=lambda setup: "-".join(setup))
def pd(request, tmp_path_factory):
    """(colocated, producer, consumer, proxy): one colocated server and the disaggregated trio, all on
    the same model, with the KV connector named by the parameter."""
    connector, model = request.param
    model_args = ["--model", request.getfixturevalue("tiny_model")] if model == "tiny" else []
    storage = str(tmp_path_factory.mktemp(f"kv-{connector}"))
    colocated = ServerProcess(*model_args)
    producer = ServerProcess(*model_args, *connector_args(connector, "producer", storage))
    consumer = ServerProcess(*model_args, *connector_args(connector, "consumer", storage))
    proxy = None
    try:
        for server in (colocated, producer, consumer):
            server.wait_ready()
        proxy = ProxyProcess(producer.base_url, consumer.base_url)
        proxy.wait_ready()
        yield colocated, producer, consumer, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        for server in (consumer, producer, colocated):
            server.stop()
            server.kill()


def openai_client(base_url: str):
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_the_producer_answers_with_kv_transfer_params(pd):
    _, producer, _, _ = pd
    resp = httpx.post(f"{producer.base_url}/v1/completions", timeout=300, json={
        "model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0.0,
        "kv_transfer_params": {"do_remote_decode": True}})
    assert resp.status_code == 200, resp.text
    assert isinstance(resp.json().get("kv_transfer_params"), dict)


@pytest.mark.parametrize("prompt", PROMPTS, ids=["text", "haiku", "token-ids"])
def test_completions_through_the_proxy_equal_the_colocated_server(pd, prompt):
    colocated, _, _, proxy = pd
    kwargs = dict(model=MODEL_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0)
    expected = openai_client(colocated.base_url).completions.create(**kwargs)
    got = openai_client(proxy.base_url).completions.create(**kwargs)
    assert got.choices[0].text == expected.choices[0].text
    assert got.choices[0].finish_reason == expected.choices[0].finish_reason
    assert got.usage.prompt_tokens == expected.usage.prompt_tokens
    assert got.usage.completion_tokens == expected.usage.completion_tokens


def test_streamed_completion_through_the_proxy_equals_the_colocated_text(pd):
    colocated, _, _, proxy = pd
    kwargs = dict(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0.0)
    expected = openai_client(colocated.base_url).completions.create(**kwargs).choices[0].text
    stream = openai_client(proxy.base_url).completions.create(**kwargs, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == expected


def test_chat_through_the_proxy_equals_the_colocated_server_streamed_or_not(pd):
    colocated, _, _, proxy = pd
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0)
    expected = openai_client(colocated.base_url).chat.completions.create(**kwargs).choices[0].message.content
    client = openai_client(proxy.base_url)
    assert client.chat.completions.create(**kwargs).choices[0].message.content == expected
    stream = client.chat.completions.create(**kwargs, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected


def test_concurrent_requests_through_the_proxy_each_get_their_own_answer(pd):
    from concurrent.futures import ThreadPoolExecutor

    colocated, _, _, proxy = pd
    prompts = [f"Count from {i} to {i + 5}:" for i in range(4)]

    def complete(base_url: str, prompt: str) -> str:
        return openai_client(base_url).completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0.0).choices[0].text

    expected = [complete(colocated.base_url, p) for p in prompts]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda p: complete(proxy.base_url, p), prompts))
    assert got == expected


def test_the_proxy_lists_the_consumers_models(pd):
    _, _, _, proxy = pd
    assert [m.id for m in openai_client(proxy.base_url).models.list().data] == [MODEL_NAME]
