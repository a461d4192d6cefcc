"""Result objects: latency/throughput math on synthetic timestamps, JSON keys, printing."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from folovllm.bench.results import (
    bench_command,
    CpuShare,
    RequestTiming,
    build_result,
    format_ratio_table,
    format_result,
    kv_cache_summary,
    latency_stats,
    prefill_tok_s,
    read_peak_rss_mb,
    write_results,
)

RESULT_KEYS = {
    "name", "engine", "model", "dtype", "device", "config", "num_requests", "input_tokens", "output_tokens",
    "duration_s", "request_throughput", "input_tok_s", "output_tok_s", "total_tok_s", "ttft_ms", "tpot_ms",
    "itl_ms", "e2el_ms", "peak_memory_mb", "kv_cache",
}


def _timings() -> list[RequestTiming]:
    # Two requests sent at t=10: 5 tokens at 10.1, 10.2, ... and 3 tokens at 10.3, 10.5, 10.7.
    return [
        RequestTiming(4, 5, arrival_time=10.0, first_token_time=10.1, finished_time=10.5,
                      token_times=[10.1, 10.2, 10.3, 10.4, 10.5]),
        RequestTiming(6, 3, arrival_time=10.0, first_token_time=10.3, finished_time=10.7,
                      token_times=[10.3, 10.5, 10.7]),
    ]


def _result(**overrides: object) -> dict:
    kwargs = dict(name="decode-heavy", engine="folovllm", model="m.gguf", dtype="bfloat16", device="cpu",
                  config={"max_num_seqs": 2}, timings=_timings(), duration_s=0.8, peak_memory_mb=100.0)
    kwargs.update(overrides)
    return build_result(**kwargs)  # type: ignore[arg-type]


def test_tpot_is_decode_time_per_token_after_the_first() -> None:
    first, second = _timings()
    assert first.tpot == pytest.approx((0.5 - 0.1) / 4)
    assert second.tpot == pytest.approx((0.7 - 0.3) / 2)
    assert RequestTiming(1, 1, 0.0, 1.0, 0.5).tpot is None
    assert RequestTiming(1, 5, 0.0, 1.0).ttft is None


def test_latency_stats_match_numpy_percentiles_in_ms() -> None:
    values = [0.01 * i for i in range(1, 101)]
    stats = latency_stats(values)
    assert stats is not None
    assert stats["mean"] == pytest.approx(505.0)
    assert stats["p50"] == pytest.approx(np.percentile(np.array(values) * 1000, 50))
    assert stats["p99"] == pytest.approx(np.percentile(np.array(values) * 1000, 99))
    assert latency_stats([]) is None


def test_result_throughputs_and_latencies() -> None:
    r = _result()
    assert RESULT_KEYS <= set(r)
    assert (r["num_requests"], r["input_tokens"], r["output_tokens"]) == (2, 10, 8)
    assert r["request_throughput"] == pytest.approx(2 / 0.8)
    assert r["input_tok_s"] == pytest.approx(10 / 0.8)
    assert r["output_tok_s"] == pytest.approx(8 / 0.8)
    assert r["total_tok_s"] == pytest.approx(18 / 0.8)
    assert r["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert r["e2el_ms"]["p50"] == pytest.approx(600.0)
    assert r["tpot_ms"]["mean"] == pytest.approx((100.0 + 200.0) / 2)
    # ITL pools every gap: four of 100 ms and two of 200 ms.
    assert r["itl_ms"]["mean"] == pytest.approx((4 * 100 + 2 * 200) / 6)
    assert set(r["ttft_ms"]) == {"mean", "p50", "p90", "p99"}


def test_unmeasurable_latencies_are_null() -> None:
    timings = [RequestTiming(4, 5, arrival_time=0.0, finished_time=1.0)]
    r = _result(timings=timings, duration_s=1.0)
    assert r["ttft_ms"] is None and r["tpot_ms"] is None and r["itl_ms"] is None
    assert r["e2el_ms"]["mean"] == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="duration_s"):
        _result(duration_s=0.0)


def test_prefill_rate_is_input_over_last_first_token() -> None:
    assert prefill_tok_s(_timings()) == pytest.approx(10 / 0.3)
    assert prefill_tok_s([RequestTiming(4, 5, 0.0, 1.0)]) is None


def test_kv_cache_summary_reports_slot_utilization() -> None:
    kv = kv_cache_summary({"num_blocks": 100, "block_size": 16, "peak_blocks_used": 10,
                           "peak_used_slots": 120, "peak_usage": 0.1})
    assert kv == {"num_blocks": 100, "block_size": 16, "peak_usage": 0.1, "peak_blocks_used": 10,
                  "peak_used_slots": 120, "slot_utilization": 0.75}
    assert kv_cache_summary(None) is None


def test_json_round_trip_and_printing(tmp_path: Path) -> None:
    kv = kv_cache_summary({"num_blocks": 8, "block_size": 16, "peak_blocks_used": 2,
                           "peak_used_slots": 20, "peak_usage": 0.25})
    ours = _result(kv_cache=kv, extra={"prefill_tok_s": 50.0})
    theirs = _result(engine="hf-static", duration_s=1.6, extra={"prefill_tok_s": 25.0})
    path = tmp_path / "out.json"
    write_results([ours, theirs], path)
    assert json.loads(path.read_text()) == [ours, theirs]

    text = format_result(ours)
    assert "Successful requests:" in text and "Benchmark duration (s):" in text
    assert "Output tokens:                          8 (10.0 tok/s)" in text
    table = format_ratio_table(ours, [theirs], ["output_tok_s", "prefill_tok_s"])
    assert table.count("2.00x") == 2


def test_peak_rss_is_positive() -> None:
    assert read_peak_rss_mb() > 10


def test_cpu_share_is_a_fraction_of_the_cores() -> None:
    share = CpuShare(threads=1)
    deadline = time.perf_counter() + 0.05
    while time.perf_counter() < deadline:
        pass
    assert 0.3 < share.stop() <= 1.2


def test_bench_command_is_the_command_line_of_that_benchmark_only(monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["/x/bin/folovllm", "bench", "profile", "--model", "a b", "--out", "p.json"])
    assert bench_command("profile") == "folovllm bench profile --model 'a b' --out p.json"
    assert bench_command("host") is None
    monkeypatch.setattr("sys.argv", ["pytest", "-q"])
    assert bench_command("profile") is None
