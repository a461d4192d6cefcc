"""benchmarks/batch_invariance.py: its options, and the cost summary (medians of each side, their ratio)."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "batch_invariance.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("batch_invariance_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["batch_invariance_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_options(bench):
    args = bench.parse_args(["needle", "--tiers", "native,avx2", "--batches", "8,24"])
    assert args.batch_sizes == [8, 24] and args.chunk == 64
    assert bench.parse_args(["cost", "--rounds", "2"]).workloads == "decode-heavy,prefill-heavy"
    with pytest.raises(SystemExit):
        bench.parse_args(["needle", "--tiers", "sse4"])
    with pytest.raises(SystemExit):
        bench.parse_args(["cost", "--workloads", "variable"])
    command = bench.bench_command("prefill-heavy", True, "--num-threads 2", "x.json")
    assert command[-6:] == ["prefill-heavy", "--batch-invariant", "--num-threads", "2", "--output-json", "x.json"]


def test_summary_is_the_ratio_of_medians(bench):
    runs = {"decode-heavy": {"off": [{"output_tok_s": v} for v in (100, 90, 110)],
                             "on": [{"output_tok_s": v} for v in (85, 70, 95)]}}
    summary = bench.summarize(runs)["decode-heavy:output_tok_s"]
    assert summary["median_off"] == 100 and summary["median_on"] == 85
    assert summary["ratio"] == pytest.approx(0.85) and summary["meets_bar"]
