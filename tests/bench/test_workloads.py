"""Synthetic workloads: shapes, overrides, seeds and special-token avoidance."""
from __future__ import annotations

import pytest

from folovllm.bench.workloads import WORKLOADS, build_workload, special_token_ids

VOCAB = 1000


@pytest.mark.parametrize(
    ("name", "num_requests", "input_len", "output_len"),
    [("decode-heavy", 64, 10, 128), ("prefill-heavy", 16, 512, 16)],
)
def test_fixed_workloads_have_their_shape(name: str, num_requests: int, input_len: int, output_len: int) -> None:
    requests = build_workload(name, VOCAB)
    assert len(requests) == num_requests
    assert all(len(r.prompt_token_ids) == input_len for r in requests)
    assert all(r.max_tokens == output_len for r in requests)


def test_variable_workload_spreads_max_tokens_over_its_range() -> None:
    requests = build_workload("variable", VOCAB)
    lengths = [r.max_tokens for r in requests]
    assert len(requests) == 64 and all(len(r.prompt_token_ids) == 10 for r in requests)
    assert all(16 <= n <= 256 for n in lengths)
    assert len(set(lengths)) > 20


def test_overrides_replace_the_spec() -> None:
    requests = build_workload("decode-heavy", VOCAB, num_requests=3, input_len=7, output_len=5)
    assert [(len(p), m) for p, m in requests] == [(7, 5)] * 3
    variable = build_workload("variable", VOCAB, output_len=20, num_requests=50)
    assert all(16 <= r.max_tokens <= 20 for r in variable)
    tiny = build_workload("variable", VOCAB, output_len=4)
    assert all(1 <= r.max_tokens <= 4 for r in tiny)


def test_same_seed_same_requests_other_seed_other_prompts() -> None:
    assert build_workload("variable", VOCAB, seed=3) == build_workload("variable", VOCAB, seed=3)
    assert build_workload("variable", VOCAB, seed=3) != build_workload("variable", VOCAB, seed=4)


def test_prompts_avoid_special_ids_and_stay_in_vocab() -> None:
    special = set(range(0, 990))  # only 10 ids left to draw from
    requests = build_workload("prefill-heavy", VOCAB, special)
    ids = {t for r in requests for t in r.prompt_token_ids}
    assert ids <= set(range(990, VOCAB))
    assert all(isinstance(t, int) for t in requests[0].prompt_token_ids)


def test_bad_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="Unknown workload"):
        build_workload("nope", VOCAB)
    with pytest.raises(ValueError, match="num_requests"):
        build_workload("decode-heavy", VOCAB, num_requests=0)
    with pytest.raises(ValueError, match="No usable token ids"):
        build_workload("decode-heavy", 3, {0, 1, 2})


def test_special_token_ids_reads_special_and_added_tokens() -> None:
    class Tok:
        all_special_ids = [0, 2]
        added_tokens_decoder = {5: "<x>"}

    assert special_token_ids(Tok()) == {0, 2, 5}
    assert set(WORKLOADS) == {"decode-heavy", "prefill-heavy", "variable"}
