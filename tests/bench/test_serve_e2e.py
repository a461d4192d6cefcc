"""One short `bench serve` sweep against a live `folovllm serve`: the JSON list, fields and plots."""
import argparse
import json

import pytest

from folovllm.bench.serve import add_serve_args, run_serve
from tests.entrypoints.openai.conftest import MODEL_NAME, ServerProcess

LATENCY_FIELDS = {"mean", "p50", "p90", "p99", "max"}


@pytest.mark.slow
def test_bench_serve_sweep_against_live_server(tmp_path, capsys):
    server = ServerProcess()
    try:
        server.wait_ready()
        out_json, plot_dir = tmp_path / "serve.json", tmp_path / "plots"
        args = add_serve_args(argparse.ArgumentParser()).parse_args([
            "--base-url", server.base_url, "--num-prompts", "3", "--input-len", "8", "--output-len", "4",
            "--sweep-rates", "inf,20", "--max-concurrency", "2", "--goodput", "ttft:60000",
            "--output-json", str(out_json), "--plot", str(plot_dir), "--no-progress"])
        returned = run_serve(args)
    finally:
        server.stop()
        server.kill()

    results = json.loads(out_json.read_text())
    assert results == json.loads(json.dumps(returned))
    assert [r["config"]["request_rate"] for r in results] == ["inf", "20"]
    for r in results:
        assert r["model"] == MODEL_NAME and r["engine"] == "folovllm"
        assert r["num_requests"] == 3 and r["failed_requests"] == 0 and r["failures"] == {}
        assert r["input_tokens"] == 3 * 8 and r["output_tokens"] == 3 * 4  # ignore_eos: exact lengths
        assert r["duration_s"] > 0 and r["output_tok_s"] == pytest.approx(12 / r["duration_s"])
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            assert set(r[key]) == LATENCY_FIELDS and 0 < r[key]["p50"] <= r[key]["max"]
            assert r[key]["p50"] <= r[key]["p90"] <= r[key]["p99"] <= r[key]["max"]
        assert r["ttft_ms"]["max"] <= r["e2el_ms"]["max"]
        assert r["ttft_ms"]["mean"] <= r["e2el_ms"]["mean"] and r["ttft_ms"]["p50"] <= r["e2el_ms"]["p50"]
        assert r["input_tok_s"] == pytest.approx(24 / r["duration_s"])
        assert r["total_tok_s"] == pytest.approx(r["input_tok_s"] + r["output_tok_s"])
        assert r["goodput"]["good_requests"] == 3
    assert len(list(plot_dir.glob("*-cdf.png"))) == 2 and len(list(plot_dir.glob("*-sweep.png"))) == 1
    console = capsys.readouterr().out
    for label in ("Successful requests:", "Benchmark duration (s):", "Input tokens:", "Output tokens:",
                  "Mean / P50 / P90 / P99 TTFT:", "Mean / P50 / P90 / P99 ITL:", "Failed requests:"):
        assert label in console


@pytest.mark.slow
def test_vllm_bench_serve_line_saves_vllms_result_keys(tmp_path):
    server = ServerProcess()
    try:
        server.wait_ready()
        args = add_serve_args(argparse.ArgumentParser()).parse_args([
            "--host", "127.0.0.1", "--port", str(server.port), "--endpoint", "/v1/completions",
            "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "4",
            "--num-prompts", "3", "--request-rate", "inf", "--ignore-eos", "--save-result",
            "--result-dir", str(tmp_path), "--result-filename", "vllm.json", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"])
        run_serve(args)
    finally:
        server.stop()
        server.kill()
    saved = json.loads((tmp_path / "vllm.json").read_text())
    assert (saved["completed"], saved["failed"], saved["total_input_tokens"], saved["total_output_tokens"]) == (
        3, 0, 24, 12)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p99"):
            assert saved[f"{stat}_{metric}_ms"] >= 0
    assert saved["request_throughput"] > 0 and saved["output_throughput"] == pytest.approx(12 / saved["duration"])
    assert saved["total_token_throughput"] == pytest.approx(36 / saved["duration"])
    assert saved["model_id"] == MODEL_NAME and saved["output_lens"] == [4, 4, 4]
    assert saved["ttft_ms"]["p50"] > 0  # our own keys ride along
