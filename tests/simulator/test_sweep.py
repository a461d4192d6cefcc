"""``simulate sweep``: the size search, the replica sweep with its latency grid, and the prefill:decode
ratio study (small deterministic sweeps on a linear profile), with their JSON rows and plots."""
from __future__ import annotations

import argparse
import json

import pytest

from folovllm.engine.args import add_engine_args, engine_config_from_args
from folovllm.simulator.cli import SCHEDULER_FIELDS
from folovllm.simulator.cost_model import LinearCostModel
from folovllm.simulator.roofline import QWEN3_0_6B
from folovllm.simulator.sweep import add_sweep_args, run_sweep
from folovllm.simulator.sweep_pd import parse_counts, parse_ratios, split_instances
from folovllm.simulator.sweep_trials import slo_load, smallest_passing

PROFILE = {"fixed_s": 0.005, "per_prefill_token_s": 5e-5, "per_decode_row_s": 2e-4, "per_context_token_s": 1e-7,
           "per_request_s": 0.0}


def sweep_args(tmp_path, *argv: str) -> argparse.Namespace:
    path = tmp_path / "profile.json"
    LinearCostModel("test", PROFILE, defaults={"num_kv_blocks": 2048, "max_model_len": 4096,
                                               "kv_bytes_per_token": QWEN3_0_6B.kv_bytes_per_token}).save(path)
    parser = argparse.ArgumentParser()
    add_sweep_args(parser)
    add_engine_args(parser, only=SCHEDULER_FIELDS)
    return parser.parse_args(["--profile", str(path), "--dataset", "sharegpt-like", "--slo-ttft-p99", "1.0",
                              "--slo-tpot-p99", "0.1", "--router", "least_loaded", *argv])


def sweep(args: argparse.Namespace) -> list[dict]:
    return run_sweep(args, engine_config_from_args(args))


def test_smallest_passing_doubles_then_bisects():
    tried = []

    def attempt(n: int) -> dict:
        tried.append(n)
        return {"ok": n >= 5}

    assert smallest_passing(attempt, lambda r: r["ok"], limit=64) == (5, {"ok": True})
    assert tried == [1, 2, 4, 8, 6, 5]
    assert smallest_passing(attempt, lambda r: r["ok"], limit=4) == (None, None)
    tried.clear()
    assert smallest_passing(attempt, lambda r: r["ok"], limit=6)[0] == 5  # the cap itself is tried
    assert tried == [1, 2, 4, 6, 5]
    assert smallest_passing(attempt, lambda r: r["ok"], limit=0) == (None, None)


def test_slo_load_is_the_tighter_of_the_two_slos():
    row = {"ttft_p99_ms": 500.0, "tpot_p99_ms": 80.0}
    assert slo_load(row, 1.0, 0.1) == pytest.approx(0.8)
    assert slo_load({**row, "tpot_p99_ms": None}, 1.0, 0.1) == pytest.approx(0.5)
    assert slo_load({**row, "ttft_p99_ms": None}, 1.0, 0.1) == float("inf")


def test_ratio_and_count_parsing_and_splits():
    assert parse_ratios("1:1, 1:2,3:1") == [(1, 1), (1, 2), (3, 1)]
    assert parse_counts("2,4", "--pd-instances") == [2, 4]
    for bad in ("1-2", "0:1", "a:b", ""):
        with pytest.raises(ValueError, match="--pd-ratios"):
            parse_ratios(bad)
    with pytest.raises(ValueError, match="--pd-instances"):
        parse_counts("2,x", "--pd-instances")
    assert split_instances(4, (1, 3)) == (1, 3)
    assert split_instances(3, (1, 1)) == (2, 1)  # halves round up to the prefill pool
    assert split_instances(3, (1, 2)) == (1, 2)
    assert split_instances(2, (1, 7)) == (1, 1)  # each pool keeps one replica
    assert split_instances(2, (7, 1)) == (1, 1)
    with pytest.raises(ValueError, match="at least 2"):
        split_instances(1, (1, 1))


def test_replica_sweep_with_latency_grid_and_plots(tmp_path):
    out, plots = tmp_path / "rates.json", tmp_path / "plots"
    rows = sweep(sweep_args(tmp_path, "--num-prompts", "150", "--rate", "10,40", "--replicas-grid", "1,2",
                            "--output-json", str(out), "--plot", str(plots)))
    fewest = [r for r in rows if r["kind"] == "fewest_replicas"]
    fixed = {(r["rate"], r["replicas"]): r for r in rows if r["kind"] == "fixed_replicas"}
    assert [r["rate"] for r in fewest] == [10.0, 40.0] and set(fixed) == {(10.0, 1), (10.0, 2), (40.0, 1), (40.0, 2)}
    assert fewest[0]["replicas"] <= fewest[1]["replicas"]
    for row in fewest:
        assert row["ttft_p99_ms"] <= 1000 and row["tpot_p99_ms"] <= 100 and row["failed_requests"] == 0
    for rate in (10.0, 40.0):
        assert fixed[(rate, 2)]["ttft_p99_ms"] <= fixed[(rate, 1)]["ttft_p99_ms"]
        assert fixed[(rate, 1)]["ttft_p50_ms"] <= fixed[(rate, 1)]["ttft_p99_ms"]
    assert fixed[(40.0, 1)]["ttft_p99_ms"] > fixed[(10.0, 1)]["ttft_p99_ms"]  # load raises queueing
    assert json.loads(out.read_text()) == rows
    assert (plots / "sim-replicas-vs-rate.png").stat().st_size > 1000
    assert (plots / "sim-latency-vs-rate.png").stat().st_size > 1000


def test_pd_ratio_sweep_is_deterministic_and_picks_the_best_split(tmp_path):
    argv = ("--num-prompts", "150", "--rate", "30", "--pd-ratios", "1:1,1:2,2:1", "--pd-instances", "3",
            "--max-replicas", "12")
    out, plots = tmp_path / "pd.json", tmp_path / "plots"
    rows = sweep(sweep_args(tmp_path, *argv, "--output-json", str(out), "--plot", str(plots)))
    assert json.loads(out.read_text()) == rows
    assert (plots / "sim-pd-goodput.png").stat().st_size > 1000
    assert sweep(sweep_args(tmp_path, *argv)) == rows

    fewest = {r["ratio"]: r for r in rows if r["kind"] == "pd_fewest"}
    assert list(fewest) == ["colocated", "1:1", "1:2", "2:1"]
    for ratio, row in fewest.items():
        if row["instances"] is None:
            continue
        assert row["ttft_p99_ms"] <= 1000 and row["tpot_p99_ms"] <= 100 and row["failed_requests"] == 0
        if ratio != "colocated":
            p, d = map(int, ratio.split(":"))
            k = row["prefill"] // p
            assert (row["prefill"], row["decode"], row["instances"]) == (k * p, k * d, k * (p + d))

    fixed = [r for r in rows if r["kind"] == "pd_fixed"]
    assert [(r["ratio"], r["prefill"], r["decode"]) for r in fixed] == [
        ("colocated", None, None), ("1:1", 2, 1), ("1:2", 1, 2), ("2:1", 2, 1)]
    assert all(r["instances"] == 3 for r in fixed)
    split = [r for r in fixed if r["prefill"] is not None]
    assert fixed[1]["goodput_req_s"] == fixed[3]["goodput_req_s"]  # the same 2P+1D shape, run once
    best = [r for r in split if r["best"]]
    assert len(best) == 1 and best[0]["good_fraction"] == max(r["good_fraction"] for r in split)
    ties = [r for r in split if r["good_fraction"] == best[0]["good_fraction"]]
    assert slo_load(best[0], 1.0, 0.1) == min(slo_load(r, 1.0, 0.1) for r in ties)
    for row in fixed:
        assert 0.0 <= row["good_fraction"] <= 1.0
        assert row["good_rate_req_s"] == pytest.approx(30.0 * row["good_fraction"])
        assert row["meets_slos"] == (row["failed_requests"] == 0 and row["ttft_p99_ms"] <= 1000
                                     and row["tpot_p99_ms"] <= 100)


def test_trial_seconds_scales_the_requests_with_the_rate(tmp_path):
    rows = sweep(sweep_args(tmp_path, "--rate", "10,20", "--trial-seconds", "3", "--replicas-grid", "1"))
    assert [(r["rate"], r["num_prompts"]) for r in rows if r["kind"] == "fixed_replicas"] == [(10.0, 30), (20.0, 60)]
    with pytest.raises(ValueError, match="finite rates"):
        sweep(sweep_args(tmp_path, "--rate", "10,inf", "--trial-seconds", "3"))
    with pytest.raises(ValueError, match="--trial-seconds"):
        sweep(sweep_args(tmp_path, "--rate", "10", "--trial-seconds", "0"))


def test_sweep_refuses_inconsistent_options(tmp_path):
    with pytest.raises(ValueError, match="--pd-ratios"):
        sweep(sweep_args(tmp_path, "--rate", "10", "--pd-instances", "4"))
    with pytest.raises(ValueError, match="--replicas-grid"):
        sweep(sweep_args(tmp_path, "--rate", "10", "--pd-ratios", "1:1", "--replicas-grid", "1"))
    with pytest.raises(ValueError, match="at least 2"):
        sweep(sweep_args(tmp_path, "--num-prompts", "5", "--rate", "10", "--pd-ratios", "1:1",
                         "--pd-instances", "1"))
