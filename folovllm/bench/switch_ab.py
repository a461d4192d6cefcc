"""One engine switch on vs off, end to end: offline greedy generates timed in alternating rounds.

Two engines are loaded in one process, the same except for one switch; each round runs every workload
on both, alternating which goes first, so both see the same machine state. The result holds the median
of each side, their ratio and whether the two sides' greedy tokens agree (a switch that changes the
tokens is a bug, not a speed-up).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from folovllm import LLM, SamplingParams

METRICS = ("output_tok_s", "input_tok_s", "ms_per_output_token")


@dataclass(frozen=True)
class SwitchWorkload:
    """``requests`` prompts of ``prompt_len`` random token ids; output lengths spread evenly from
    ``shortest`` to ``longest`` (greedy, ignore_eos); scored by ``metric``."""

    requests: int
    prompt_len: int
    shortest: int
    longest: int
    metric: str = "output_tok_s"

    def output_lens(self) -> list[int]:
        if self.requests == 1:
            return [self.longest]
        spread = self.longest - self.shortest
        return [self.shortest + spread * i // (self.requests - 1) for i in range(self.requests)]

    def score(self, seconds: float) -> float:
        if self.metric == "ms_per_output_token":
            return seconds * 1000 / sum(self.output_lens())
        if self.metric == "input_tok_s":
            return self.requests * self.prompt_len / seconds
        return sum(self.output_lens()) / seconds


def add_switch_args(parser: argparse.ArgumentParser, workloads: dict[str, SwitchWorkload],
                    default: list[str] | None = None) -> None:
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", default=",".join(default or workloads),
                        help=f"comma-separated: {', '.join(workloads)}")
    parser.add_argument("--out", help="write the results here (JSON)")


def chosen_workloads(arg: str, workloads: dict[str, SwitchWorkload]) -> list[str]:
    names = arg.split(",")
    unknown = [n for n in names if n not in workloads]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {', '.join(workloads)}")
    return names


def timed_generate(llm: LLM, prompts: list[list[int]], lens: list[int]) -> tuple[float, list[list[int]]]:
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outputs]


def prompt_id_range(vocab_size: int) -> tuple[int, int]:
    """Random prompts' token ids: [1000, 20000) for a real vocabulary, its upper part for a tiny one."""
    return min(1000, vocab_size // 4), min(20000, vocab_size)


def compare_switch(engines: dict[bool, LLM], workloads: dict[str, SwitchWorkload], names: list[str],
                   rounds: int, threads: int, vocab_size: int = 20000) -> dict[str, Any]:
    """Time ``names`` on ``engines[True]`` (switch on) and ``engines[False]`` over ``rounds`` alternating
    rounds; prints one line per workload and returns the results (medians, ratio, samples)."""
    rng = random.Random(0)
    low, high = prompt_id_range(vocab_size)

    def fresh_prompts(name: str) -> list[list[int]]:  # new every round: a cached prefix would time nothing
        return [[rng.randrange(low, high) for _ in range(workloads[name].prompt_len)]
                for _ in range(workloads[name].requests)]

    warm_up = fresh_prompts(names[0])[:1]
    for llm in engines.values():
        timed_generate(llm, warm_up, [4])
    results: dict[str, Any] = {"threads": threads, "rounds": rounds, "load_before": os.getloadavg(),
                               "workloads": {}}
    samples: dict[str, dict[bool, list[float]]] = {n: {True: [], False: []} for n in names}
    tokens: dict[str, dict[bool, list[list[int]]]] = {n: {} for n in names}
    for r in range(rounds):
        for name in names:
            prompts = fresh_prompts(name)  # the same for both sides of this round
            for on in ((True, False) if r % 2 == 0 else (False, True)):  # alternate which goes first
                seconds, tokens[name][on] = timed_generate(engines[on], prompts, workloads[name].output_lens())
                samples[name][on].append(workloads[name].score(seconds))
    results["load_after"] = os.getloadavg()
    for name in names:
        metric = workloads[name].metric
        on, off = (statistics.median(samples[name][side]) for side in (True, False))
        same = tokens[name][True] == tokens[name][False]
        results["workloads"][name] = {"metric": metric, "on": on, "off": off, "on_over_off": on / off,
                                      "samples_on": samples[name][True], "samples_off": samples[name][False],
                                      "same_greedy_tokens": same}
        print(f"{name:15s} {metric:20s} on {on:8.2f}  off {off:8.2f}  on/off {on / off:5.3f}  same tokens: {same}")
    print(f"load average before {results['load_before'][0]:.1f}, after {results['load_after'][0]:.1f}")
    return results


def write_switch_results(results: dict[str, Any], out: str | None) -> None:
    if out:
        Path(out).write_text(json.dumps(results, indent=1) + "\n")
