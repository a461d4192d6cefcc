"""``bench throughput`` end to end with a fake LLM (the engine's offline API) and a tiny HF model."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import folovllm
from folovllm.bench.throughput import (
    add_throughput_args,
    measure_engine,
    run_throughput,
)
from folovllm.bench.workloads import BenchRequest


class FakeTokenizer:
    all_special_ids = [0, 1, 2]

    def __len__(self) -> int:
        return 64


class FakeLLM:
    """Mimics ``folovllm.LLM``: one generate call, per-request metrics on the perf_counter clock."""

    model_path: str = ""

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.tokenizer = FakeTokenizer()
        self.model_path = model or FakeLLM.model_path
        self.calls: list[list[int]] = []

    def generate(self, prompts: list[dict], params: Any, use_tqdm: bool = True) -> list[SimpleNamespace]:
        params = params if isinstance(params, list) else [params] * len(prompts)
        self.calls.append([p.max_tokens for p in params])
        start = time.perf_counter()
        outs = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            metrics = SimpleNamespace(arrival_time=start, first_token_time=start + 0.01 * (i + 1),
                                      finished_time=start + 0.01 * (i + 1) + 0.001 * p.max_tokens)
            outs.append(SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"],
                                        outputs=[SimpleNamespace(token_ids=[3] * p.max_tokens)], metrics=metrics))
        return outs

    def get_kv_cache_stats(self) -> dict[str, Any]:
        return {"num_blocks": 64, "block_size": 16, "peak_blocks_used": 8, "peak_used_slots": 100, "peak_usage": 0.125}


def test_measure_engine_warms_up_then_times_one_burst() -> None:
    llm = FakeLLM()
    requests = [BenchRequest([5] * 20, 7), BenchRequest([6] * 3, 2)]
    timings, duration = measure_engine(llm, requests)
    assert llm.calls == [[4, 4], [7, 2]]
    assert [t.num_output_tokens for t in timings] == [7, 2]
    assert [t.num_prompt_tokens for t in timings] == [20, 3]
    assert timings[0].arrival_time == timings[1].arrival_time
    assert timings[1].ttft == pytest.approx(0.02, abs=0.005)
    assert duration > 0


def test_short_output_is_an_error() -> None:
    class ShortLLM(FakeLLM):
        def generate(self, prompts: list[dict], params: Any, use_tqdm: bool = True) -> list[SimpleNamespace]:
            outs = super().generate(prompts, params, use_tqdm)
            outs[0].outputs[0].token_ids.pop()
            return outs

    with pytest.raises(RuntimeError, match="ignore_eos"):
        measure_engine(ShortLLM(), [BenchRequest([5] * 4, 3)])


def test_run_throughput_with_hf_baseline_writes_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    monkeypatch.setattr(folovllm, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # keep the test runner's setting

    parser = add_throughput_args(argparse.ArgumentParser())
    out = tmp_path / "r.json"
    args = parser.parse_args(["--workload", "prefill-heavy", "--num-requests", "3", "--input-len", "6",
                              "--output-len", "2", "--model", str(tmp_path / "tiny"), "--dtype", "float32",
                              "--baseline", "hf", "--hf-sequential-requests", "2", "--output-json", str(out)])
    results = run_throughput(args)

    assert [r["engine"] for r in results] == ["folovllm", "hf-static", "hf-sequential"]
    assert results[0]["kv_cache"]["slot_utilization"] == pytest.approx(100 / 128)
    assert results[0]["config"]["max_num_batched_tokens"] == 2048
    assert [r["num_requests"] for r in results] == [3, 3, 2]
    assert json.loads(out.read_text()) == results


def test_defaults() -> None:
    args = add_throughput_args(argparse.ArgumentParser()).parse_args([])
    assert (args.workload, args.dtype, args.baseline, args.model) == ("decode-heavy", "auto", "none", None)
