"""Benchmark plots write non-empty PNGs; the step-trace reader names a bad line."""
import json

import pytest

from folovllm.bench.plots import plot_latency_cdfs, plot_step_timeline, plot_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_latency_cdfs(tmp_path):
    samples = {"ttft_ms": [10, 20, 35, 80], "tpot_ms": [5, 6, 7], "itl_ms": [4, 5, 6, 9, 12], "e2el_ms": [50, 90]}
    plot_latency_cdfs(samples, tmp_path / "cdf.png", title="run")
    assert_png(tmp_path / "cdf.png")
    plot_latency_cdfs({"e2el_ms": [1.0]}, tmp_path / "sparse.png")  # missing metrics leave empty panels
    assert_png(tmp_path / "sparse.png")


def test_sweep(tmp_path):
    def run(rate, tok_s, ttft):
        stats = {"mean": ttft, "p50": ttft, "p90": ttft * 2, "p99": ttft * 3, "max": ttft * 4}
        return {"config": {"request_rate": rate}, "output_tok_s": tok_s, "ttft_ms": stats,
                "tpot_ms": None, "e2el_ms": stats}

    plot_sweep([run("4", 300.0, 90.0), run("1", 100.0, 20.0), run("inf", 350.0, 900.0)], tmp_path / "sweep.png")
    assert_png(tmp_path / "sweep.png")


def test_step_timeline(tmp_path):
    trace = tmp_path / "steps.jsonl"
    records = [{"time": 100.0 + 0.05 * i, "num_prefill_tokens": 256 if i < 3 else 0,
                "num_decode_tokens": min(i, 8), "num_running": min(i + 1, 8), "num_waiting": max(0, 6 - i),
                "num_preempted": int(i == 5), "kv_blocks_used": 4 * i, "kv_usage": i / 40} for i in range(30)]
    trace.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    plot_step_timeline(trace, tmp_path / "steps.png")
    assert_png(tmp_path / "steps.png")


def test_step_timeline_rejects_a_bad_record(tmp_path):
    trace = tmp_path / "steps.jsonl"
    trace.write_text(json.dumps({"time": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"steps.jsonl:1: a step record needs numeric"):
        plot_step_timeline(trace, tmp_path / "steps.png")
