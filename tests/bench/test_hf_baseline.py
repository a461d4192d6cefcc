"""HF baselines on a tiny random Llama saved with transformers' own classes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from folovllm.bench.hf_baseline import (
    load_hf_model,
    run_hf_baselines,
    run_static,
    torch_dtype,
)
from folovllm.bench.workloads import BenchRequest


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_baselines_run_and_count_useful_tokens(tiny_llama: Path) -> None:
    # Different prompt lengths (left padding) and max_tokens: the static batch runs 4 steps for both.
    requests = [BenchRequest([5, 6, 7], 4), BenchRequest([8, 9, 10, 11, 12], 2)]
    static, sequential = run_hf_baselines(tiny_llama, requests, name="t", dtype="float32", sequential_requests=1)

    assert static["engine"] == "hf-static"
    assert (static["num_requests"], static["input_tokens"], static["output_tokens"]) == (2, 8, 6)
    assert static["extra"]["computed_output_tokens"] == 8
    assert static["ttft_ms"] is not None and static["extra"]["prefill_tok_s"] > 0
    assert static["e2el_ms"]["p50"] <= static["duration_s"] * 1000
    # The prefill span ends inside the run: its rate over the same prompts is at least the whole run's.
    assert static["extra"]["prefill_tok_s"] >= static["input_tok_s"]
    assert static["output_tok_s"] == pytest.approx(6 / static["duration_s"])
    assert static["ttft_ms"]["mean"] <= static["e2el_ms"]["mean"]
    for key in ("ttft_ms", "e2el_ms"):
        assert static[key]["p50"] <= static[key]["p90"] <= static[key]["p99"]

    assert sequential["engine"] == "hf-sequential"
    assert (sequential["num_requests"], sequential["output_tokens"]) == (1, 4)
    assert sequential["config"]["requests_run"] == 1
    assert sequential["tpot_ms"] is not None


def test_static_batch_times_every_row_at_its_own_length(tiny_llama: Path) -> None:
    model = load_hf_model(tiny_llama, "float32")
    requests = [BenchRequest([5, 6, 7], 3), BenchRequest([8, 9, 10, 11, 12], 1)]
    timings, duration, computed = run_static(model, requests)
    assert computed == 6 and [t.num_output_tokens for t in timings] == [3, 1]
    assert [len(t.token_times) for t in timings] == [3, 1]
    assert timings[1].finished_time == timings[1].first_token_time < timings[0].finished_time
    assert timings[0].finished_time - timings[0].arrival_time <= duration


def test_unknown_dtype_is_rejected() -> None:
    with pytest.raises(ValueError, match="Unsupported dtype"):
        torch_dtype("int8")
