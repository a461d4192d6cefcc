"""bench serve load generation: arrival processes, rate parsing, requests built from the CLI options."""
import argparse

import numpy as np
import pytest

from folovllm.bench.serve import (
    add_serve_args,
    arrival_offsets,
    build_requests,
    parse_rates,
)


def test_poisson_arrivals_mean_rate_and_exponential_spread():
    gaps = np.diff(arrival_offsets(20000, 8.0, 1.0, seed=1))
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # CV 1: Poisson


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_arrivals_keep_the_rate_and_set_the_burstiness(burstiness):
    offsets = arrival_offsets(20000, 5.0, burstiness, seed=2)
    gaps = np.diff(offsets)
    assert offsets[0] == 0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.05)
    # gamma(shape k): squared coefficient of variation = 1/k
    assert (gaps.std() / gaps.mean()) ** 2 == pytest.approx(1 / burstiness, rel=0.1)


def test_arrivals_are_reproducible_and_burst_is_all_at_once():
    assert arrival_offsets(50, 3.0, 0.5, seed=7) == arrival_offsets(50, 3.0, 0.5, seed=7)
    assert arrival_offsets(50, 3.0, 0.5, seed=7) != arrival_offsets(50, 3.0, 0.5, seed=8)
    assert arrival_offsets(4, float("inf"), 0.5, seed=0) == [0.0] * 4
    for rate, burstiness in ((0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)):
        with pytest.raises(ValueError):
            arrival_offsets(3, rate, burstiness)


def test_parse_rates():
    assert parse_rates("1,2.5,inf") == [1.0, 2.5, float("inf")]
    for bad in ("", "1,x", "0,1"):
        with pytest.raises(ValueError, match="--sweep-rates"):
            parse_rates(bad)


def args_for(*argv):
    return add_serve_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_build_requests_from_options():
    reqs = build_requests(args_for("--num-prompts", "5", "--input-len", "6", "--output-len", "2"), None)
    assert len(reqs) == 5 and all(len(r.prompt) == 6 and r.max_tokens == 2 for r in reqs)
    chat = build_requests(args_for("--endpoint", "chat", "--num-prompts", "2", "--input-len", "4"), None)
    assert all(len(r.messages[0]["content"].split()) == 4 for r in chat)
    ranged = build_requests(args_for("--num-prompts", "40", "--input-len-range", "2:3",
                                     "--token-id-range", "10:20"), None)
    assert {len(r.prompt) for r in ranged} == {2, 3} and all(10 <= t < 20 for r in ranged for t in r.prompt)
    assert len(build_requests(args_for("--dataset", "decode-heavy", "--num-prompts", "3"), None)) == 3
    with pytest.raises(ValueError, match="not both"):
        build_requests(args_for("--input-len", "3", "--input-len-range", "2:4"), None)
    with pytest.raises(ValueError, match="--dataset-path"):
        build_requests(args_for("--dataset", "jsonl"), None)


def test_vllm_bench_serve_spellings():
    from folovllm.bench.serve import base_url_of, endpoint_of

    args = args_for("--host", "10.0.0.2", "--port", "8123", "--endpoint", "/v1/completions",
                    "--dataset-name", "random", "--random-input-len", "40", "--random-output-len", "10",
                    "--random-range-ratio", "0.5", "--num-prompts", "50", "--seed", "1", "--ignore-eos",
                    "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "90,99", "--save-result",
                    "--result-dir", "out", "--result-filename", "r.json", "--disable-tqdm",
                    "--tokenizer", "org/name", "--max-concurrency", "4", "--request-rate", "2")
    assert base_url_of(args) == "http://10.0.0.2:8123" and endpoint_of(args) == "completions"
    reqs = build_requests(args, None)
    assert all(20 <= len(r.prompt) <= 60 and 5 <= r.max_tokens <= 15 for r in reqs)
    assert len({len(r.prompt) for r in reqs}) > 1 and all(r.ignore_eos for r in reqs)
    assert args.no_progress and args.save_result and (args.result_dir, args.result_filename) == ("out", "r.json")
    chat = args_for("--backend", "openai-chat", "--base-url", "http://h:1")
    assert endpoint_of(chat) == "chat" and base_url_of(chat) == "http://h:1"
    assert endpoint_of(args_for("--endpoint", "/v1/chat/completions")) == "chat"
    with pytest.raises(ValueError, match="not both"):
        build_requests(args_for("--random-range-ratio", "0.2", "--input-len-range", "2:4"), None)
