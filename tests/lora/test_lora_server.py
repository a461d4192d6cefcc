"""LoRA through the server and the openai client: adapters from --lora-modules (both forms) in /v1/models with
their parent, a request's model picks its adapter (greedy tokens equal the merged transformers model's), runtime
load and unload, a bad adapter is a 400 naming what does not fit, the metric. The app runs in this process on
its engine thread (as --no-engine-process); the slow twin runs a live `folovllm serve`."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.engine.conftest import tiny_llama_dir  # noqa: F401
from tests.entrypoints.openai.conftest import MODEL_NAME, running_server
from tests.lora.adapters import ATTN, MLP, hf_greedy, merged_model, write_adapter

PROMPT = [5, 17, 33, 40, 99, 7]
MAX_TOKENS = 5
# the messages' text alone, so that a chat prompt's ids fit the tiny model's vocabulary
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def adapter_dirs(tiny_llama_dir: str, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    root = tmp_path_factory.mktemp("served_adapters")
    return {"a1": write_adapter(root / "a1", config, 4, ("q_proj", "v_proj"), seed=1),
            "a2": write_adapter(root / "a2", config, 8, ATTN + MLP, seed=2, rslora=True),
            "a3": write_adapter(root / "a3", config, 4, MLP, seed=3),
            "big": write_adapter(root / "big", config, 32, ("q_proj",), seed=4)}


def lora_args(adapter_dirs: dict[str, Path]) -> list[str]:
    json_module = '{"name": "a2", "path": "%s", "base_model_name": "%s"}' % (adapter_dirs["a2"], MODEL_NAME)
    return ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
            "--lora-modules", f"a1={adapter_dirs['a1']}", json_module, "--allow-runtime-lora-updating",
            "--chat-template", CHAT_TEMPLATE]


def test_in_process_app(tiny_llama_dir, adapter_dirs) -> None:  # noqa: F811
    import openai
    from fastapi.testclient import TestClient

    from folovllm.engine.args import engine_config_from_args
    from folovllm.entrypoints.cli import build_parser
    from folovllm.entrypoints.openai.api_server import build_app, start_engine_core
    from folovllm.entrypoints.openai.server_args import ServerConfig
    from folovllm.entrypoints.openai.validation import ChatSettings

    args = build_parser().parse_args(["serve", "--model", tiny_llama_dir, "--dtype", "float32", "--max-model-len",
                                      "256", "--no-engine-process", *lora_args(adapter_dirs)])
    core, tokenizer = start_engine_core(engine_config_from_args(args), own_process=False, log_level="warning")
    config = ServerConfig([MODEL_NAME], enable_lora=True, lora_modules=args.lora_modules,
                          allow_runtime_lora_updating=True, chat=ChatSettings(chat_template=CHAT_TEMPLATE))
    with TestClient(build_app(core, tokenizer, config)) as http:
        client = openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="unused", max_retries=0, http_client=http)
        check_serving(client, http, tiny_llama_dir, adapter_dirs)


@pytest.mark.slow
def test_live_server(tiny_llama_dir, adapter_dirs) -> None:  # noqa: F811
    import openai

    with running_server("--model", tiny_llama_dir, "--max-model-len", "256", *lora_args(adapter_dirs)) as proc:
        client = openai.OpenAI(base_url=f"{proc.base_url}/v1", api_key="unused", max_retries=0)
        check_serving(client, httpx.Client(base_url=proc.base_url, timeout=30), tiny_llama_dir, adapter_dirs)


def complete(client, model: str) -> list[int]:
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    return out.choices[0].model_extra["token_ids"]


def check_serving(client, http: httpx.Client, tiny_llama_dir: str, adapter_dirs: dict[str, Path]) -> None:  # noqa: F811
    import openai

    models = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
    assert models == {MODEL_NAME: None, "a1": MODEL_NAME, "a2": MODEL_NAME}
    for name in ("a1", "a2", None):
        expected = hf_greedy(merged_model(tiny_llama_dir, adapter_dirs.get(name)), PROMPT, MAX_TOKENS)
        assert complete(client, name or MODEL_NAME) == expected, name
    check_reported_model(client, http, "a2")
    check_reported_model(client, http, MODEL_NAME)
    with pytest.raises(openai.NotFoundError):
        complete(client, "a3")

    bad = http.post("/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": str(adapter_dirs["big"])})
    assert bad.status_code == 400 and "max_lora_rank=16" in bad.json()["error"]["message"]
    missing = http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/no/such/folder"})
    assert missing.status_code == 400 and "adapter_config.json" in missing.json()["error"]["message"]
    ok = http.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": str(adapter_dirs["a3"])})
    assert ok.status_code == 200, ok.text
    assert complete(client, "a3") == hf_greedy(merged_model(tiny_llama_dir, adapter_dirs["a3"]), PROMPT, MAX_TOKENS)
    assert http.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": "x"}).status_code == 400
    metrics = http.get("/metrics").text
    assert 'vllm:lora_requests_info{max_lora="2"' in metrics
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "a3"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        complete(client, "a3")
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "a3"}).status_code == 404


def check_reported_model(client, http: httpx.Client, model: str) -> None:
    """A response names the adapter that served it (the served model without one), as vLLM's do:
    completions, chat, Responses and Messages, whole and in every streamed chunk or event."""
    text = dict(model=model, prompt=PROMPT, max_tokens=2, temperature=0)
    assert client.completions.create(**text).model == model
    assert {c.model for c in client.completions.create(**text, stream=True,
                                                       stream_options={"include_usage": True})} == {model}
    chat = dict(model=model, messages=[{"role": "user", "content": "1+2="}], max_tokens=2, temperature=0)
    assert client.chat.completions.create(**chat).model == model
    assert {c.model for c in client.chat.completions.create(**chat, stream=True,
                                                            stream_options={"include_usage": True})} == {model}
    answer = dict(model=model, input="1+2=", max_output_tokens=2, temperature=0)
    assert client.responses.create(**answer).model == model
    events = [e for e in client.responses.create(**answer, stream=True) if hasattr(e, "response")]
    assert events and {e.response.model for e in events} == {model}
    message = {"model": model, "max_tokens": 2, "temperature": 0, "messages": [{"role": "user", "content": "1+2="}]}
    assert http.post("/v1/messages", json=message).json()["model"] == model
    streamed = http.post("/v1/messages", json={**message, "stream": True})
    starts = [json.loads(line[len("data: "):]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert [e["message"]["model"] for e in starts if e["type"] == "message_start"] == [model]
