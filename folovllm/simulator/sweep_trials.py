"""The pieces every ``simulate sweep`` study shares: one trial (a simulated run at a rate on a cluster
shape, remembered so that two studies asking for the same shape run it once), the SLO test, the row of
figures kept per trial, and the smallest size that passes (doubling, then bisection)."""
from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from typing import Any

from folovllm.config import EngineConfig
from folovllm.simulator.cli import build_setup, run_one

TrialKey = tuple[float, str, str, int, "tuple[int, int] | None"]


def meets(result: dict[str, Any], ttft_s: float, tpot_s: float) -> bool:
    """p99 TTFT and p99 TPOT within the SLOs, and no request failed."""
    return (result["failed_requests"] == 0 and result["ttft_ms"] is not None
            and result["ttft_ms"]["p99"] <= ttft_s * 1000 and (result["tpot_ms"] is None
                                                               or result["tpot_ms"]["p99"] <= tpot_s * 1000))


class Trials:
    """Runs (and remembers) simulated trials of the sweep's workload; goodput is counted against the
    sweep's SLOs (a request is good when its own TTFT and TPOT are within them)."""

    def __init__(self, args: argparse.Namespace, config: EngineConfig) -> None:
        seconds = args.trial_seconds
        if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"--trial-seconds must be a positive number of seconds, got {seconds}")
        self.args, self.config = args, config
        self._done: dict[TrialKey, dict[str, Any]] = {}

    def run(self, rate: float, policy: str, admission: str, replicas: int = 1,
            pd: tuple[int, int] | None = None) -> dict[str, Any]:
        """The result of the workload at ``rate`` on ``replicas`` replicas (or the ``pd`` P:D pools)."""
        key: TrialKey = (rate, policy, admission, replicas if pd is None else 0, pd)
        if key not in self._done:
            slos = [f"ttft:{self.args.slo_ttft_p99 * 1000:g}", f"tpot:{self.args.slo_tpot_p99 * 1000:g}"]
            num = self.args.num_prompts
            if self.args.trial_seconds is not None:
                num = max(1, round(rate * self.args.trial_seconds))  # the same span of traffic at every rate
            trial = argparse.Namespace(**{**vars(self.args), "request_rate": rate, "num_prompts": num,
                                          "replicas": replicas, "pd": pd, "goodput": slos,
                                          "percentile_metrics": "ttft,tpot,e2el", "metric_percentiles": "50,99"})
            config = dataclasses.replace(self.config, scheduling_policy=policy, admission=admission)
            self._done[key] = run_one(trial, build_setup(trial, config))
        return self._done[key]

    def meets(self, result: dict[str, Any]) -> bool:
        return meets(result, self.args.slo_ttft_p99, self.args.slo_tpot_p99)


def figures(result: dict[str, Any] | None, rate: float) -> dict[str, Any]:
    """The latency percentiles, throughput and goodput a sweep row keeps of one trial at ``rate`` (None:
    no trial). ``goodput_req_s`` is ``bench serve``'s (good requests over the run, whose end a short
    trial's slowest request sets); ``good_rate_req_s`` is the offered rate times the share of good
    requests: what the deployment sustains, which the ratio study compares."""
    def stat(key: str, p: str) -> float | None:
        return result[key][p] if result and result[key] else None

    good = result.get("goodput") if result else None
    fraction = good["good_requests"] / result["config"]["num_prompts"] if good else None
    return {"num_prompts": result["config"]["num_prompts"] if result else None,
            "ttft_p50_ms": stat("ttft_ms", "p50"), "ttft_p99_ms": stat("ttft_ms", "p99"),
            "tpot_p50_ms": stat("tpot_ms", "p50"), "tpot_p99_ms": stat("tpot_ms", "p99"),
            "output_tok_s": result["output_tok_s"] if result else None,
            "failed_requests": result["failed_requests"] if result else None,
            "goodput_req_s": good["request_goodput"] if good else None, "good_fraction": fraction,
            "good_rate_req_s": fraction * rate if fraction is not None and math.isfinite(rate) else None}


def slo_load(row: dict[str, Any], ttft_s: float, tpot_s: float) -> float:
    """The larger of p99 TTFT / its SLO and p99 TPOT / its SLO: under 1 meets both; lower has more headroom."""
    ttft, tpot = row["ttft_p99_ms"], row["tpot_p99_ms"]
    return max(math.inf if ttft is None else ttft / (ttft_s * 1000), 0.0 if tpot is None else tpot / (tpot_s * 1000))


def describe(row: dict[str, Any]) -> str:
    """``p99 TTFT 217 ms, TPOT 6.8 ms`` for a row of ``figures`` (a dash for a missing figure)."""
    def ms(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    return f"p99 TTFT {ms(row['ttft_p99_ms'], 0)} ms, TPOT {ms(row['tpot_p99_ms'], 1)} ms"


def smallest_passing(attempt: Callable[[int], dict[str, Any]], passes: Callable[[dict[str, Any]], bool],
                     limit: int, start: int = 1) -> tuple[int | None, dict[str, Any] | None]:
    """Smallest n in [start, limit] whose ``attempt(n)`` passes, assuming passing is monotone in n:
    double from ``start`` until one passes (capped at ``limit``), then bisect. (None, None) if ``limit``
    does not pass."""
    if limit < start:
        return None, None
    low, high = start - 1, start
    while True:
        result = attempt(high)
        if passes(result):
            break
        if high >= limit:
            return None, None
        low, high = high, min(high * 2, limit)
    best = (high, result)
    while high - low > 1:
        mid = (low + high) // 2
        result = attempt(mid)
        if passes(result):
            high, best = mid, (mid, result)
        else:
            low = mid
    return best
