"""The on/off switch benchmark's bookkeeping: output lengths, scores, alternation, token agreement."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from folovllm.bench.switch_ab import (
    SwitchWorkload,
    chosen_workloads,
    compare_switch,
    write_switch_results,
)


class FakeLLM:
    """Answers each prompt with ``max_tokens`` copies of ``token``; records the order of calls."""

    def __init__(self, token: int, calls: list[str], name: str) -> None:
        self.token, self.calls, self.name = token, calls, name

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(self.name)
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[self.token] * p.max_tokens)]) for p in params]


def test_output_lens_spread_evenly_and_one_stream_takes_the_longest():
    assert SwitchWorkload(5, 10, 16, 256).output_lens() == [16, 76, 136, 196, 256]
    assert SwitchWorkload(1, 10, 16, 128).output_lens() == [128]
    assert SwitchWorkload(3, 10, 64, 64).output_lens() == [64, 64, 64]


def test_scores_per_metric():
    assert SwitchWorkload(2, 10, 50, 50).score(2.0) == pytest.approx(50.0)
    assert SwitchWorkload(2, 10, 50, 50, "input_tok_s").score(2.0) == pytest.approx(10.0)
    assert SwitchWorkload(2, 10, 50, 50, "ms_per_output_token").score(2.0) == pytest.approx(20.0)


def test_unknown_workload_is_an_error():
    with pytest.raises(SystemExit, match="unknown workloads"):
        chosen_workloads("a,zzz", {"a": SwitchWorkload(1, 1, 1, 1)})


@pytest.mark.parametrize("off_token, same", [(7, True), (8, False)])
def test_compare_alternates_and_checks_tokens(tmp_path, off_token, same):
    calls: list[str] = []
    engines = {True: FakeLLM(7, calls, "on"), False: FakeLLM(off_token, calls, "off")}
    results = compare_switch(engines, {"w": SwitchWorkload(2, 3, 4, 4)}, ["w"], rounds=3, threads=1)
    assert calls == ["on", "off", "on", "off", "off", "on", "on", "off"]  # warm-up, then alternating
    row = results["workloads"]["w"]
    assert row["same_greedy_tokens"] is same
    assert len(row["samples_on"]) == len(row["samples_off"]) == 3
    assert row["on_over_off"] == pytest.approx(row["on"] / row["off"])
    out = tmp_path / "r.json"
    write_switch_results(results, str(out))
    assert json.loads(out.read_text())["rounds"] == 3
