"""`folovllm serve --speculative-config`: the same greedy text as the engine without it, and vLLM's spec_decode_*
series."""
from __future__ import annotations

import json

import httpx

from tests.entrypoints.openai.conftest import MODEL_NAME, parse_metrics, running_server

PROMPT = "one two three four five one two three four five one two three"


def complete(base_url: str) -> str:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_served_speculation_keeps_the_text_and_counts_drafts(tiny_model):
    from folovllm import LLM, SamplingParams

    plain = LLM(model=tiny_model)  # the same defaults as the server, without speculation
    want = plain.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0].text
    del plain
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    with running_server("--model", tiny_model, "--speculative-config", json.dumps(spec)) as server:
        assert complete(server.base_url) == want
        metrics = parse_metrics(httpx.get(f"{server.base_url}/metrics"))
    drafts = metrics["vllm:spec_decode_num_drafts_total"]
    proposed = metrics["vllm:spec_decode_num_draft_tokens_total"]
    accepted = metrics["vllm:spec_decode_num_accepted_tokens_total"]
    per_position = [metrics[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{position={p}}}"] for p in range(3)]
    assert drafts > 0 and proposed >= drafts and 0 <= accepted <= proposed
    assert sum(per_position) == accepted and per_position == sorted(per_position, reverse=True)


def test_an_unsupported_method_stops_the_server_naming_it(tiny_model):
    from tests.entrypoints.openai.conftest import ServerProcess

    server = ServerProcess("--model", tiny_model, "--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2}')
    assert server.proc.wait(120) != 0
    assert "'medusa' is not implemented" in server.proc.stderr.read()
