"""`folovllm serve <hub id>` as vLLM's quick start runs it: the model from a test-built HF cache, offline."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.entrypoints.openai.conftest import ServerProcess
from tests.tiny_hub import TINY_REPO_ID


class HubServer(ServerProcess):
    """``folovllm serve MODEL ...`` with the model positional and no served-model-name: as typed."""

    def __init__(self, *argv: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "folovllm.entrypoints.cli", "serve", *argv, "--port", str(self.port),
               "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "FOLOVLLM_API_KEY": ""},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def hub_server(tiny_hub, monkeypatch_module):
    hf_home, _ = tiny_hub
    monkeypatch_module.setenv("HF_HOME", str(hf_home))
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    proc = HubServer(TINY_REPO_ID, "--max-logprobs", "2", "--enable-prefix-caching", "-tp", "1",
                     "--dtype", "float32", "--kv-cache-memory", "64MiB")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
        proc.kill()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_serves_the_hub_id_with_its_generation_config(hub_server):
    import openai

    client = openai.OpenAI(base_url=f"{hub_server.base_url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [TINY_REPO_ID]
    completion = client.completions.create(model=TINY_REPO_ID, prompt="The capital of France is", max_tokens=4,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 4
    chat = client.chat.completions.create(model=TINY_REPO_ID, messages=[{"role": "user", "content": "Hi"}],
                                          extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 5  # max_new_tokens from generation_config.json
    with pytest.raises(openai.BadRequestError, match="max_logprobs"):
        client.completions.create(model=TINY_REPO_ID, prompt="x", max_tokens=1, logprobs=3)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
