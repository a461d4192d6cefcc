"""Simulated runs: deterministic for a seed, bench serve's requests and result format, prefix-cache hits,
replicas and routers, PD, and the roofline profile."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from folovllm.bench.serve_client import RequestOutcome
from folovllm.bench.serve_results import build_serve_result
from folovllm.bench.serve_workload import build_workload_requests
from folovllm.engine.args import add_engine_args, engine_config_from_args
from folovllm.simulator.cli import SCHEDULER_FIELDS, add_run_args, build_setup, run_one
from folovllm.simulator.cost_model import LinearCostModel
from folovllm.simulator.roofline import QWEN3_0_6B
from folovllm.simulator.run import simulate
from folovllm.simulator.workload import build_sim_requests

PROFILE = {"fixed_s": 0.005, "per_prefill_token_s": 5e-5, "per_decode_row_s": 2e-4, "per_context_token_s": 1e-7,
           "per_request_s": 0.0}


def sim_args(tmp_path, *argv: str) -> argparse.Namespace:
    path = tmp_path / "profile.json"
    LinearCostModel("test", PROFILE, defaults={"num_kv_blocks": 2048, "max_model_len": 4096}).save(path)
    parser = argparse.ArgumentParser()
    add_run_args(parser)
    add_engine_args(parser, only=SCHEDULER_FIELDS)
    return parser.parse_args(["--profile", str(path), *argv])


def run(args: argparse.Namespace, per_request: bool = False) -> dict:
    return run_one(args, build_setup(args, engine_config_from_args(args)), per_request)


def test_same_seed_same_result_other_seed_other_result(tmp_path):
    argv = ("--dataset", "sharegpt-like", "--num-prompts", "300", "--request-rate", "20")
    first, second = run(sim_args(tmp_path, *argv)), run(sim_args(tmp_path, *argv))
    assert first["ttft_ms"] == second["ttft_ms"] and first["itl_ms"] == second["itl_ms"]
    assert first["duration_s"] == second["duration_s"]
    other = run(sim_args(tmp_path, *argv, "--seed", "1"))
    assert other["ttft_ms"] != first["ttft_ms"]


def test_requests_have_bench_serves_lengths(tmp_path):
    args = sim_args(tmp_path, "--dataset", "shared-prefix", "--num-prompts", "50", "--input-len-range", "10:40",
                    "--output-len-range", "1:30", "--prefix-len", "64")
    served = build_workload_requests(args, 4096)
    simulated = sorted(build_sim_requests(args, 4096), key=lambda r: r.index)
    assert [(r.prompt_len, r.max_tokens) for r in served] == [(r.prompt_len, r.output_len) for r in simulated]
    assert all(len(r.prompt_token_ids()) == r.prompt_len for r in simulated)
    assert simulated[0].prompt_token_ids()[:64] == simulated[1].prompt_token_ids()[:64]


def test_shared_prefix_hits_the_prefix_cache(tmp_path):
    argv = ("--dataset", "shared-prefix", "--num-prompts", "100", "--prefix-len", "512", "--input-len", "32",
            "--request-rate", "10")
    cached = run(sim_args(tmp_path, *argv))
    uncached = run(sim_args(tmp_path, *argv, "--no-prefix-caching"))
    assert cached["extra"]["prefix_cache_hit_rate"] > 0.8
    assert uncached["extra"]["prefix_cache_hit_rate"] == 0.0
    assert cached["ttft_ms"]["mean"] < uncached["ttft_ms"]["mean"]
    random = run(sim_args(tmp_path, "--num-prompts", "100", "--request-rate", "10", "--no-check-request"))
    assert random["extra"]["prefix_cache_hit_rate"] == 0.0


def test_result_matches_bench_serves_for_the_same_timings(tmp_path):
    args = sim_args(tmp_path, "--num-prompts", "40", "--request-rate", "8", "--input-len-range", "10:300",
                    "--output-len-range", "1:40", "--goodput", "ttft:50", "tpot:30")
    result = run(args, per_request=True)
    # The same requests as client outcomes, timed from the per-request lists the simulator kept.
    setup = build_setup(args, engine_config_from_args(args))
    from folovllm.simulator.run import simulate

    rec = simulate(setup, build_sim_requests(args, setup.max_model_len), keep_token_times=True,
                   with_check_request=args.check_request).recorder
    outcomes = []
    for i, times in enumerate(rec.token_times):
        outcome = RequestOutcome(None, send_time=rec.arrival[i], end_time=times[-1], chunk_times=list(times),
                                 prompt_tokens=int(rec.prompt_len[i]), output_tokens=int(rec.output_len[i]))
        outcome.request = argparse.Namespace(tag="")
        outcomes.append(outcome)
    reference = build_serve_result(outcomes, name="x", engine="x", model="x", config={},
                                   slos={"ttft": 50.0, "tpot": 30.0})
    for key in ("num_requests", "input_tokens", "output_tokens", "duration_s", "request_throughput",
                "output_tok_s", "failed_requests"):
        assert result[key] == pytest.approx(reference[key])
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat in ("mean", "p50", "p90", "p99", "max"):
            assert result[key][stat] == pytest.approx(reference[key][stat])
    assert result["goodput"]["good_requests"] == reference["goodput"]["good_requests"]
    assert len(result["itls"]) == 40 and result["p99_ttft_ms"] == pytest.approx(reference["ttft_ms"]["p99"])


@pytest.mark.parametrize("router", ["round_robin", "least_loaded", "prefix_aware"])
def test_replicas_share_the_load(tmp_path, router):
    argv = ("--dataset", "sharegpt-like", "--num-prompts", "400", "--request-rate", "40")
    one = run(sim_args(tmp_path, *argv))
    four = run(sim_args(tmp_path, *argv, "--replicas", "4", "--router", router))
    assert four["extra"]["replicas"] == 4
    assert four["ttft_ms"]["p99"] < one["ttft_ms"]["p99"]
    assert four["output_tokens"] == one["output_tokens"]


def test_prefix_aware_routing_keeps_a_prefix_on_one_replica(tmp_path):
    argv = ("--dataset", "shared-prefix", "--num-prompts", "200", "--prefix-len", "512", "--input-len", "32",
            "--request-rate", "20", "--replicas", "4")
    aware = run(sim_args(tmp_path, *argv, "--router", "prefix_aware"))
    spread = run(sim_args(tmp_path, *argv, "--router", "round_robin"))
    assert aware["extra"]["prefix_cache_hit_rate"] > spread["extra"]["prefix_cache_hit_rate"]


def test_pd_disaggregation_runs_every_token(tmp_path):
    argv = ("--dataset", "sharegpt-like", "--num-prompts", "200", "--request-rate", "20")
    pd = run(sim_args(tmp_path, *argv, "--pd", "1:2", "--kv-bytes-per-token", str(QWEN3_0_6B.kv_bytes_per_token)))
    plain = run(sim_args(tmp_path, *argv, "--replicas", "3"))
    assert pd["failed_requests"] == 0 and pd["output_tokens"] == plain["output_tokens"]
    slow_link = run(sim_args(tmp_path, *argv, "--pd", "1:2", "--kv-bytes-per-token", "100000000",
                             "--kv-link-gbps", "1"))
    assert slow_link["itl_ms"]["max"] > pd["itl_ms"]["max"]
    with pytest.raises(ValueError, match="KV bytes per token"):
        run(sim_args(tmp_path, *argv, "--pd", "1:1"))


def test_roofline_profile_and_tensor_parallelism(tmp_path):
    argv = ("--profile", "roofline:h100", "--model-config", "Qwen3-0.6B", "--dataset", "sharegpt-like",
            "--num-prompts", "300", "--request-rate", "50")
    args = sim_args(tmp_path, *argv)
    result = run(args)
    assert result["failed_requests"] == 0 and result["model"] == "Qwen3-0.6B"
    assert 2.0 < result["tpot_ms"]["p50"] < 50.0  # a 0.6B model on an H100: milliseconds per token
    tp2 = run(sim_args(tmp_path, *argv, "-tp", "2"))
    assert tp2["config"]["num_kv_blocks"] > result["config"]["num_kv_blocks"]
    assert np.isfinite(tp2["tpot_ms"]["p50"])


def two_requests_sent_together(tmp_path) -> str:
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps({"prompt": [100 + i + k for k in range(96)], "max_tokens": 4, "arrival_s": 0.0,
                                        "ignore_eos": True}) + "\n" for i in range(2)))
    return str(path)


def first_steps(args: argparse.Namespace) -> list:
    setup = build_setup(args, engine_config_from_args(args))
    return simulate(setup, build_sim_requests(args, setup.max_model_len), keep_steps=True).cluster.engines[0].steps


def test_the_api_server_delays_requests_sent_together_by_the_same_time(tmp_path):
    argv = ("--dataset", "jsonl", "--dataset-path", two_requests_sent_together(tmp_path))
    together = first_steps(sim_args(tmp_path, *argv))
    assert together[0].start == 0.0 and [r for r, _ in together[0].scheduled] == ["0", "1"]
    delayed = first_steps(sim_args(tmp_path, *argv, "--api-server-ms", "2"))
    # both reach the replica 2 ms after they were sent, so both prefill in its first step
    assert delayed[0].start == pytest.approx(0.002) and [r for r, _ in delayed[0].scheduled] == ["0", "1"]
    result = run(sim_args(tmp_path, *argv, "--api-server-ms", "2", "--no-check-request"), per_request=True)
    assert result["ttfts"][0] == pytest.approx(delayed[0].end)  # from the client's send, not the hand-over


def test_a_profiles_api_server_time_is_the_default(tmp_path):
    path = tmp_path / "with-api.json"
    LinearCostModel("test", PROFILE, defaults={"num_kv_blocks": 2048, "max_model_len": 4096},
                    api_server_s=0.003).save(path)
    args = sim_args(tmp_path, "--dataset", "jsonl", "--dataset-path", two_requests_sent_together(tmp_path))
    args.profile = str(path)
    assert first_steps(args)[0].start == pytest.approx(0.003)
    args.api_server_ms = 0.0
    assert first_steps(args)[0].start == 0.0


def test_the_check_request_primes_the_first_prompt_and_is_not_timed(tmp_path):
    args = sim_args(tmp_path, "--input-len", "64", "--output-len", "8", "--request-rate", "inf", "--num-prompts", "4")
    setup = build_setup(args, engine_config_from_args(args))
    done = simulate(setup, build_sim_requests(args, setup.max_model_len), keep_steps=True, with_check_request=True)
    steps = done.cluster.engines[0].steps
    # bench serve's check: the first prompt alone, then its 3 more tokens; nothing of the burst yet
    assert [s.scheduled for s in steps[:4]] == [[("0", 64)], [("0", 1)], [("0", 1)], [("0", 1)]]
    # the burst is sent when the check has ended; its first prompt finds three of its four blocks cached
    assert steps[4].start == steps[3].end
    assert steps[4].scheduled == [("0", 16), ("1", 64), ("2", 64), ("3", 64)]
    rec = done.recorder
    assert (rec.arrival == steps[3].end).all()
    assert rec.first_token[0] - rec.arrival[0] == pytest.approx(steps[4].end - steps[4].start)
    assert (rec.output_len == 8).all()  # the check's 4 tokens are not the timed request's


def test_simulate_run_sends_the_check_request_unless_told_not_to(tmp_path):
    argv = ("--input-len", "64", "--output-len", "8", "--request-rate", "inf", "--num-prompts", "4")
    checked, unchecked = run(sim_args(tmp_path, *argv)), run(sim_args(tmp_path, *argv, "--no-check-request"))
    assert checked["extra"]["prefix_cache_hit_rate"] > 0.0 and unchecked["extra"]["prefix_cache_hit_rate"] == 0.0
    assert checked["output_tokens"] == unchecked["output_tokens"] == 4 * 8
    assert checked["ttft_ms"]["max"] < unchecked["ttft_ms"]["max"]  # 48 prompt tokens fewer to prefill


def test_a_burst_reaches_the_replica_together_later_by_its_size(tmp_path):
    path = tmp_path / "burst.jsonl"
    path.write_text("".join(json.dumps({"prompt": [100 + 7 * i + k for k in range(32)], "max_tokens": 2,
                                        "arrival_s": 0.0 if i < 4 else 1.0, "ignore_eos": True}) + "\n"
                            for i in range(5)))
    args = sim_args(tmp_path, "--dataset", "jsonl", "--dataset-path", str(path), "--api-server-ms", "2",
                    "--api-server-burst-ms", "0.5")
    steps = first_steps(args)
    # four sent at 0: all in the first step, 2 + 3 x 0.5 ms after (the first of a burst pays none of the
    # burst term); the lone one at 1 s: 2 ms after, as a request alone
    assert steps[0].start == pytest.approx(0.0035) and [r for r, _ in steps[0].scheduled] == ["0", "1", "2", "3"]
    lone = next(s for s in steps if ("4", 32) in s.scheduled)
    assert lone.start == pytest.approx(1.002)
    profiled = tmp_path / "with-burst.json"
    LinearCostModel("test", PROFILE, defaults={"num_kv_blocks": 2048, "max_model_len": 4096},
                    api_server_s=0.002, api_server_burst_s=0.0005).save(profiled)
    args = sim_args(tmp_path, "--dataset", "jsonl", "--dataset-path", str(path))
    args.profile = str(profiled)
    assert first_steps(args)[0].start == pytest.approx(0.0035)  # the profile's figures are the default
