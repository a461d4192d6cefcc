"""``folovllm bench invariance``: its options, the command it records, and its judging on a tiny model (needles
alone vs in a batch, per mode; the cost's medians and ratio)."""
from __future__ import annotations

import json
import shlex

import pytest

from folovllm.bench.invariance import bench_command, judge_needle, reproduce_command, results_writer, summarize
from folovllm.entrypoints.cli import build_parser, main
from tests.engine.test_batch_invariance import tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    return tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


def parse(*argv: str):
    return build_parser().parse_args(["bench", "invariance", *argv])


def test_options_and_the_command_they_record() -> None:
    args = parse("needle", "--tiers", "native,avx2", "--batches", "8,24")
    assert args.tiers == ["native", "avx2"] and args.batches == [8, 24] and args.chunk == 64
    assert args.dtypes == ["bfloat16", "float32"] and args.needle_lens == [20, 75, 150, 300]
    again = parse(*shlex.split(reproduce_command(args))[3:])
    assert vars(again) == {**vars(args), "func": again.func}
    cost = parse("cost", "--rounds", "2", "--bench-args", "--num-threads 2", "--out", "c.json", "--append")
    assert cost.workloads == ["decode-heavy", "prefill-heavy"] and cost.tiers == ["native"]
    assert shlex.split(reproduce_command(cost))[-5:] == ["--bench-args", "--num-threads 2", "--out", "c.json",
                                                         "--append"]
    command = bench_command(cost, "prefill-heavy", True, "x.json")
    assert command[-7:] == ["--workload", "prefill-heavy", "--batch-invariant", "--num-threads", "2",
                            "--output-json", "x.json"]
    assert "--batch-invariant" not in bench_command(cost, "prefill-heavy", False, "x.json")


@pytest.mark.parametrize("argv", [["needle", "--tiers", "sse4"], ["needle", "--batches", "8,0"],
                                  ["needle", "--dtypes", "float16"], ["needle", "--chunk", "16,32"],
                                  ["cost", "--workloads", "shared-prefix"], ["cost", "--rounds", "0"],
                                  ["cost", "--dtypes", "float32"], ["needle", "--rounds", "2"]])
def test_bad_options_are_refused(argv) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)


def test_a_batch_must_hold_the_needles_and_more(capsys) -> None:
    assert main(["bench", "invariance", "needle", "--batches", "4", "--tiers", "native"]) == 2
    assert "each batch holds the 4 needles" in capsys.readouterr().err
    assert main(["bench", "invariance", "cost", "--append"]) == 2
    assert "give --out" in capsys.readouterr().err


def test_pieces_of_one_measurement_append_to_one_list(tmp_path) -> None:
    out = tmp_path / "r.json"

    def commands() -> list[str]:
        return [r["command"] for r in json.loads(out.read_text())]

    results_writer(str(out), append=True)({"command": "a"})  # nothing there yet: a list of one
    write = results_writer(str(out), append=True)
    write({"command": "b", "complete": False})
    write({"command": "b", "complete": True})  # a run's later writes replace its own entry
    assert commands() == ["a", "b"] and json.loads(out.read_text())[1]["complete"]
    results_writer(str(out), append=False)({"command": "c"})
    assert commands() == ["c"]


def test_needles_on_a_tiny_model_judged_per_mode(tiny_llama, tmp_path) -> None:
    out = tmp_path / "needle.json"
    main(["bench", "invariance", "needle", tiny_llama, "--dtypes", "float32", "--chunk", "16", "--tokens", "4",
          "--batches", "6", "--needle-lens", "5,20,33,60", "--out", str(out)])
    [results] = json.loads(out.read_text())
    assert results["complete"] and results["command"].startswith("folovllm bench invariance needle ") and tiny_llama in results["command"]
    assert [(c["tier"], c["dtype"], c["batch_invariant"]) for c in results["cases"]] == \
        [("native", "float32", False), ("native", "float32", True)]
    assert all(c["cases"] == 4 and c["platform"]["platform"] == "cpu" for c in results["cases"])
    assert results["cases"][1]["platform"]["batch_invariant"] == "on"
    assert results["verdict"]["on_identical_everywhere"] and results["verdict"]["on_differing_cases"] == 0


def test_judging_fails_the_mode_on_a_single_moved_case() -> None:
    def case(on: bool, tokens: int, anything: int) -> dict:
        return {"batch_invariant": on, "cases": 12, "tokens_differ": tokens, "tokens_or_logprobs_differ": anything}

    fine = judge_needle([case(False, 3, 12), case(True, 0, 0)])
    assert fine["on_identical_everywhere"] and fine["off_differing_cases"] == 12 and fine["cases_per_mode"] == 12
    moved = judge_needle([case(False, 0, 0), case(True, 0, 0), case(True, 0, 1)])
    assert not moved["on_identical_everywhere"] and moved["on_differing_cases"] == 1
    assert not judge_needle([case(False, 0, 0)])["on_identical_everywhere"]  # nothing measured proves nothing


def test_cost_is_the_ratio_of_medians_against_the_bar() -> None:
    row = summarize("decode-heavy", {False: [100.0, 90.0, 110.0], True: [85.0, 70.0, 95.0]}, None)
    assert row["metric"] == "output_tok_s" and row["off"] == 100 and row["on"] == 85
    assert row["on_over_off"] == pytest.approx(0.85) and row["meets_bar"]
    assert not summarize("prefill-heavy", {False: [100.0], True: [79.0]}, None)["meets_bar"]


def test_cost_alternates_bench_throughput_processes_on_a_tiny_model(tiny_llama, tmp_path) -> None:
    out = tmp_path / "cost.json"
    main(["bench", "invariance", "cost", tiny_llama, "--workloads", "decode-heavy", "--rounds", "1",
          "--bench-args", "--num-requests 2 --input-len 8 --output-len 4 --dtype float32 --num-threads 1",
          "--out", str(out)])
    [results] = json.loads(out.read_text())
    row = results["workloads"]["native:decode-heavy"]
    assert len(row["samples_on"]) == len(row["samples_off"]) == 1 and row["on_over_off"] > 0
    assert row["platform"]["platform"] == "cpu" and row["dtype"] == "float32"
    assert results["command"].startswith("folovllm bench invariance cost")
    assert results["sides"]["decode-heavy"][1].endswith("--batch-invariant --num-requests 2 --input-len 8 "
                                                         "--output-len 4 --dtype float32 --num-threads 1 "
                                                         "--output-json OUT.json")


def test_each_tier_process_gets_its_own_cap(monkeypatch) -> None:
    from folovllm.bench.invariance import tier_env

    monkeypatch.setenv("FOLOVLLM_CPU_ISA", "avx2")  # this process's cap, and what it set for torch
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")  # set by hand: not the cap's, so kept
    env = tier_env("avx512")
    assert env["FOLOVLLM_CPU_ISA"] == "avx512" and "ATEN_CPU_CAPABILITY" not in env
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"
    assert "FOLOVLLM_CPU_ISA" not in tier_env("native")
