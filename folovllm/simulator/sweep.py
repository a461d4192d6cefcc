"""``folovllm simulate sweep``: capacity planning on the simulator, at each request rate given.

Without ``--pd-ratios``: per scheduling policy and admission mode, the fewest replicas whose p99 TTFT
and p99 TPOT meet the SLOs (doubling, then bisection), and with ``--replicas-grid`` the latency
percentiles at fixed replica counts. With ``--pd-ratios``: the prefill/decode split study
(``sweep_pd``). Rows go to ``--output-json``, plots to ``--plot``."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from folovllm.bench.arrivals import parse_rates
from folovllm.bench.results import write_results
from folovllm.bench.serve_workload import add_workload_args
from folovllm.config import EngineConfig
from folovllm.simulator.cli import add_deployment_args
from folovllm.simulator.sweep_pd import parse_counts, parse_ratios, run_pd_study
from folovllm.simulator.sweep_plots import plot_latency_vs_rate, plot_pd_goodput, plot_replicas
from folovllm.simulator.sweep_trials import Trials, describe, figures, meets, smallest_passing

__all__ = ["add_sweep_args", "fewest_replicas", "meets", "run_sweep"]


def add_sweep_args(parser: argparse.ArgumentParser) -> None:
    add_workload_args(parser)
    add_deployment_args(parser)
    s = parser.add_argument_group("sweep")
    s.add_argument("--rate", required=True, help="request rate(s) to plan for, e.g. 1000 or 100,300,1000")
    s.add_argument("--slo-ttft-p99", type=float, required=True, help="seconds")
    s.add_argument("--slo-tpot-p99", type=float, required=True, help="seconds")
    s.add_argument("--policies", default="fcfs", help="comma-separated scheduling policies")
    s.add_argument("--admissions", default="on-demand", help="comma-separated admission modes")
    s.add_argument("--trial-seconds", type=float, default=None,
                   help="requests per trial = rate x this (the same span of traffic at every rate); "
                        "default: --num-prompts")
    s.add_argument("--max-replicas", type=int, default=256, help="the largest cluster (instances) a search tries")
    s.add_argument("--replicas-grid", default=None, metavar="N,N,...",
                   help="also run every rate at these fixed replica counts (the latency-vs-rate plot)")
    s.add_argument("--pd-ratios", default=None, metavar="P:D,...",
                   help="study prefill/decode disaggregation instead: per ratio, the fewest instances meeting "
                        "the SLOs and (with --pd-instances) the goodput at a fixed total")
    s.add_argument("--pd-instances", default=None, metavar="N,N,...",
                   help="--pd-ratios: fixed totals of instances to split by each ratio (and to run colocated)")
    s.add_argument("--output-json", default=None)
    s.add_argument("--plot", default=None, metavar="DIR", help="write the sweep's plots (PNG) here")


def fewest_replicas(trials: Trials, rate: float, policy: str, admission: str,
                    limit: int) -> tuple[int | None, dict | None]:
    """Smallest replica count meeting the SLOs (None if ``limit`` does not); its result."""
    return smallest_passing(lambda n: trials.run(rate, policy, admission, replicas=n), trials.meets, limit)


def _replica_rows(args: argparse.Namespace, trials: Trials, rates: list[float]) -> list[dict[str, Any]]:
    rows = []
    grid = parse_counts(args.replicas_grid, "--replicas-grid") if args.replicas_grid else []
    for rate in rates:
        for policy in args.policies.split(","):
            for admission in args.admissions.split(","):
                n, result = fewest_replicas(trials, rate, policy, admission, args.max_replicas)
                row = {"kind": "fewest_replicas", "rate": rate, "policy": policy, "admission": admission,
                       "replicas": n, **figures(result, rate)}
                print(f"rate {rate:g}/s {policy}/{admission}: "
                      + (f"{n} replicas ({describe(row)})" if n else f"more than {args.max_replicas} replicas"))
                rows.append(row)
                for count in grid:
                    fixed = trials.run(rate, policy, admission, replicas=count)
                    rows.append({"kind": "fixed_replicas", "rate": rate, "policy": policy, "admission": admission,
                                 "replicas": count, "meets_slos": trials.meets(fixed), **figures(fixed, rate)})
    return rows


def run_sweep(args: argparse.Namespace, config: EngineConfig) -> list[dict[str, Any]]:
    """Runs the study the options ask for; returns its rows (also written to ``--output-json``)."""
    if args.pd_instances and not args.pd_ratios:
        raise ValueError("--pd-instances splits instances by --pd-ratios; give the ratios too")
    if args.pd_ratios and args.replicas_grid:
        raise ValueError("--replicas-grid belongs to the replica sweep; run it without --pd-ratios")
    rates = parse_rates(args.rate)
    if args.trial_seconds is not None and any(math.isinf(rate) for rate in rates):
        raise ValueError("--trial-seconds needs finite rates (it draws rate x seconds requests)")
    trials = Trials(args, config)
    if args.pd_ratios:
        totals = parse_counts(args.pd_instances, "--pd-instances") if args.pd_instances else []
        rows = run_pd_study(trials, rates, args.policies.split(","), args.admissions.split(","),
                            parse_ratios(args.pd_ratios), totals, args.max_replicas)
    else:
        rows = _replica_rows(args, trials, rates)
    if args.output_json:
        write_results(rows, args.output_json)
    if args.plot:
        folder = Path(args.plot)
        if args.pd_ratios:
            plot_pd_goodput(rows, folder / "sim-pd-goodput.png")
        else:
            plot_replicas(rows, folder / "sim-replicas-vs-rate.png")
            if args.replicas_grid:
                plot_latency_vs_rate(rows, folder / "sim-latency-vs-rate.png")
    return rows
