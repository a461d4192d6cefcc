"""The burst benchmark's analysis: ITL over time, TTFT, goodput, the no-burst ratio, the table and plot."""
import pytest

from folovllm.bench.burst import (
    BACKGROUND,
    BURST,
    StreamRecord,
    add_no_burst_ratios,
    itl_over_time,
    markdown_table,
    median_ratios,
    median_table,
    plot_itl_timelines,
    summarize_run,
)


def records() -> list[StreamRecord]:
    steady = StreamRecord(BACKGROUND, 0.0, [0.1, 0.2, 0.3, 0.4], output_tokens=4)
    stalled = StreamRecord(BACKGROUND, 0.0, [0.1, 0.2, 1.2, 1.3], output_tokens=4)  # a 1 s stall
    burst = StreamRecord(BURST, 0.5, [1.1, 1.2], output_tokens=2)
    failed = StreamRecord(BURST, 0.5, error="HTTP 502: gone")
    return [steady, stalled, burst, failed]


def test_a_run_summary_counts_ttft_itl_throughput_and_goodput():
    run = summarize_run(records(), [0.5], 1.5, ttft_slo_ms=700, itl_slo_ms=500)
    assert run["background_itl_ms"]["max"] == pytest.approx(1000.0) and run["background_itl_ms"]["n"] == 6
    assert run["burst_ttft_ms"]["p50"] == pytest.approx(600.0)
    assert run["output_tokens"] == 10 and run["output_tok_s"] == pytest.approx(10 / 1.5)
    assert (run["requests"], run["failed"]) == (4, 1)
    assert run["goodput"]["good_requests"] == 2  # the stalled stream and the failure miss
    assert run["goodput"]["good_burst_fraction"] == 1.0


def test_itl_over_time_puts_each_gap_in_the_window_of_its_later_token():
    rows = itl_over_time(records(), 0.5, 1.5)
    assert [r["t_s"] for r in rows] == [0.25, 1.25]
    assert rows[1]["max"] == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="window must be positive"):
        itl_over_time(records(), 0, 1.0)


def test_burst_runs_get_their_p99_over_the_no_burst_p99_and_a_table_row(tmp_path):
    runs = []
    for interval in (None, 3.0):
        run = summarize_run(records()[:2 if interval is None else 4], [] if interval is None else [0.5], 1.5,
                            ttft_slo_ms=700, itl_slo_ms=500)
        run.update(config="a", burst_interval_s=interval, itl_over_time=itl_over_time(records(), 0.5, 1.5))
        runs.append(run)
    add_no_burst_ratios(runs)
    assert runs[0]["p99_itl_vs_no_burst"] is None and runs[1]["p99_itl_vs_no_burst"] == pytest.approx(1.0)
    runs[1]["kv_transfer"] = {"transfers": 2, "total_mb": 3.0, "mean_mb": 1.5, "mean_ms": 12.4}
    table = markdown_table(runs).splitlines()
    assert len(table) == 4 and table[2].startswith("| a | none |") and "| 1.00× |" in table[3]
    assert "| 12 / 1.5 (2) |" in table[3] and "| – |" in table[2]
    plot_itl_timelines(runs, tmp_path / "itl.png")
    assert (tmp_path / "itl.png").stat().st_size > 0


def test_repeats_compare_with_their_own_round_and_report_the_median():
    def run(repeat: int, interval: float | None, p99: float) -> dict:
        return {"config": "pd", "burst_interval_s": interval, "repeat": repeat, "repeats": 3,
                "background_itl_ms": {"p50": 20.0, "p99": p99, "max": p99, "n": 100}}

    runs = [run(0, None, 20.0), run(0, 3.0, 30.0), run(1, None, 40.0), run(1, 3.0, 40.0),
            run(2, None, 20.0), run(2, 3.0, 50.0)]
    add_no_burst_ratios(runs)
    assert [r["p99_itl_vs_no_burst"] for r in runs[1::2]] == pytest.approx([1.5, 1.0, 2.5])
    summary = median_ratios(runs)
    assert len(summary) == 1 and summary[0]["median_ratio"] == pytest.approx(1.5)
    assert summary[0]["ratios"] == pytest.approx([1.5, 1.0, 2.5])
    assert "| pd | 3 s | 1.50× | 1.50×, 1.00×, 2.50× |" in median_table(summary)
