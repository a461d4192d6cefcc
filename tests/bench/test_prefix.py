"""The prefix-caching benchmarks, end to end on a tiny model (caching on vs off in one run)."""
import argparse

from folovllm.bench.throughput import add_throughput_args, run_throughput
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (fixture)


def parse(*argv: str) -> argparse.Namespace:
    return add_throughput_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_shared_prefix_computes_less_with_caching(tiny_llama_dir):  # noqa: F811
    args = parse("--workload", "shared-prefix", "--model", tiny_llama_dir, "--num-requests", "4",
                 "--input-len", "64", "--output-len", "2", "--request-rate", "100",
                 "--dtype", "float32", "--max-model-len", "256")
    on, off = run_throughput(args)
    assert on["prefix_caching"] and not off["prefix_caching"]
    assert off["prefill_tokens_computed"] == off["prompt_tokens"] == 4 * 96
    assert on["prefill_tokens_computed"] < off["prefill_tokens_computed"]
    assert on["hit_rate"] > 0 and off["hit_rate"] == 0
    assert on["prompt_tokens"] == off["prompt_tokens"]  # the same requests both times
    # Only the 3 later requests can reuse the first one's 64-token prefix.
    assert off["prefill_tokens_computed"] - on["prefill_tokens_computed"] <= 3 * 64


def test_multi_turn_hits_from_second_turn(tiny_llama_dir):  # noqa: F811
    args = parse("--workload", "multi-turn", "--model", tiny_llama_dir, "--num-requests", "2",
                 "--input-len", "96", "--output-len", "8", "--dtype", "float32", "--max-model-len", "256")
    on, off = run_throughput(args)
    assert on["per_turn"][0]["hit_rate"] == 0
    assert on["hit_rate_from_turn_2"] > 0.7
    assert off["hit_rate_from_turn_2"] == 0
    assert [t["prompt_tokens"] for t in on["per_turn"]] == [t["prompt_tokens"] for t in off["per_turn"]]
    for turn_on, turn_off in zip(on["per_turn"][1:], off["per_turn"][1:]):
        assert turn_on["prefill_tokens_computed"] < turn_off["prefill_tokens_computed"] == turn_off["prompt_tokens"]
    assert all(t["hit_rate"] > on["per_turn"][0]["hit_rate"] for t in on["per_turn"][1:])
