"""The M1 -> M6 ladder runs every rung on one workload and reports what each rung changes."""
import argparse

import pytest

from folovllm.bench.ladder import RUNGS
from folovllm.bench.throughput import add_throughput_args, run_throughput
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (fixture)


def test_compare_all_runs_the_ladder(tiny_llama_dir, tmp_path):  # noqa: F811
    args = add_throughput_args(argparse.ArgumentParser()).parse_args([
        "--workload", "variable", "--num-requests", "6", "--output-len", "8", "--model", tiny_llama_dir,
        "--dtype", "float32", "--max-model-len", "128", "--compare", "all",
        "--output-json", str(tmp_path / "ladder.json")])
    rows = run_throughput(args)
    assert [r["name"] for r in rows] == [name for name, _ in RUNGS]
    m1, m2, m3 = rows[:3]
    assert m1["speedup"] == 1.0
    # Contiguous rungs hold max_model_len per request; the paged ones only what the tokens need.
    assert m1["kv_allocated_tokens"] >= 128 * m1["max_concurrent_requests"]
    assert m3["kv_allocated_tokens"] < m2["kv_allocated_tokens"]
    assert m3["kv_used_tokens"] / m3["kv_allocated_tokens"] > 0.5
    assert m3["max_concurrent_requests"] >= m1["max_concurrent_requests"]  # paging never lowers the batch cap
    for row in rows:
        assert row["kv_used_tokens"] <= row["kv_allocated_tokens"]
        assert row["speedup"] == pytest.approx(row["output_tok_s"] / m1["output_tok_s"])
        assert row["num_requests"] == 6 and row["max_concurrent_requests"] <= 6
    assert (tmp_path / "ladder.json").exists()
