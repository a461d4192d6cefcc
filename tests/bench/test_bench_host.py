"""``folovllm bench host``: the tiny-model workload runs, its phases add up to no more than each step, and a
flag it cannot take, or vLLM where the checkout has no harness for it, is a clear error."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from folovllm.bench import host
from folovllm.entrypoints.cli import main


def test_bench_host_reports_ms_per_step_split_by_phase(tmp_path) -> None:
    out = tmp_path / "host.json"
    main(["bench", "host", "--batches", "3", "--output-len", "6", "--rounds", "1", "--threads", "1",
          "--detokenize", "on", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["model"]["num_hidden_layers"] == 1 and result["model"]["vocab_size"] == 512
    assert [r["name"] for r in result["rows"]] == ["3 greedy detok on", "3 sampled detok on"]
    for row in result["rows"]:
        phases = row["phases_ms_per_step"]
        assert set(phases) == set(host.PHASES) and all(v >= 0 for v in phases.values())
        assert 0 < sum(phases.values()) <= row["folovllm_ms_per_step"]
        assert len(row["folovllm_tokens_sha1"]) == 1 and "vllm_ms_per_step" not in row


def test_bench_host_beside_its_switches_off(tmp_path) -> None:
    """The engine with the host fast paths off runs in the same rounds; greedy tokens agree with it."""
    out = tmp_path / "host.json"
    main(["bench", "host", "--batches", "3", "--output-len", "5", "--rounds", "2", "--threads", "1",
          "--sampling", "greedy", "--detokenize", "off", "--vs-switches-off", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["switches_off"] == list(host.HOST_SWITCHES)
    (row,) = result["rows"]
    assert len(row["folovllm_off_runs_ms"]) == 2 and row["ours_over_switches_off"] > 0
    assert row["folovllm_tokens_sha1"] == row["folovllm_off_tokens_sha1"]
    assert set(row["phases_off_ms_per_step"]) == set(host.PHASES)
    assert "switches off" in host.format_tables(result["rows"])


def test_bench_host_beside_another_checkout(tmp_path) -> None:
    """Another checkout's engine (this one here) runs in its own process in the same rounds, its commit recorded."""
    out = tmp_path / "host.json"
    main(["bench", "host", "--batches", "2", "--output-len", "4", "--rounds", "1", "--threads", "1",
          "--sampling", "greedy", "--detokenize", "off", "--vs-checkout", str(host.REPO), "--logs", str(tmp_path),
          "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["before"]["checkout"] == str(host.REPO)
    (row,) = result["rows"]
    assert len(row["before_runs_ms"]) == 1 and row["ours_over_before"] > 0
    assert "now / before" in host.format_tables(result["rows"])


def test_bench_host_refuses_what_it_cannot_run(monkeypatch, tmp_path) -> None:
    args = SimpleNamespace(batches="4,x", sampling="greedy", detokenize="off", rounds=1, output_len=4, prompt_len=4)
    with pytest.raises(ValueError, match="--batches"):
        host.host_configs(args)
    with pytest.raises(ValueError, match="--sampling"):
        host.host_configs(SimpleNamespace(**{**vars(args), "batches": "4", "sampling": "beam"}))
    monkeypatch.setattr(host, "REPO", tmp_path)  # an installation without benchmarks/vs_vllm/
    with pytest.raises(ValueError, match="source checkout"):
        host.HarnessEngine("vllm-fp32", tmp_path, 1, 4, 64, tmp_path / ".venv-vllm", tmp_path / "logs")
