"""``folovllm simulate sweep``: the fewest replicas that meet p99 TTFT and TPOT SLOs at each rate, per
scheduling policy and admission mode (doubling, then bisection), with plots."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from folovllm.bench.arrivals import parse_rates
from folovllm.bench.results import write_results
from folovllm.bench.serve_workload import add_workload_args
from folovllm.config import EngineConfig
from folovllm.simulator.cli import add_deployment_args, build_setup, run_one


def add_sweep_args(parser: argparse.ArgumentParser) -> None:
    add_workload_args(parser)
    add_deployment_args(parser)
    s = parser.add_argument_group("sweep")
    s.add_argument("--rate", required=True, help="request rate(s) to plan for, e.g. 1000 or 100,300,1000")
    s.add_argument("--slo-ttft-p99", type=float, required=True, help="seconds")
    s.add_argument("--slo-tpot-p99", type=float, required=True, help="seconds")
    s.add_argument("--policies", default="fcfs", help="comma-separated scheduling policies")
    s.add_argument("--admissions", default="on-demand", help="comma-separated admission modes")
    s.add_argument("--max-replicas", type=int, default=256)
    s.add_argument("--output-json", default=None)
    s.add_argument("--plot", default=None, metavar="DIR", help="write the two sweep plots (PNG) here")


def meets(result: dict[str, Any], ttft_s: float, tpot_s: float) -> bool:
    """p99 TTFT and p99 TPOT within the SLOs, and no request failed."""
    return (result["failed_requests"] == 0 and result["ttft_ms"] is not None
            and result["ttft_ms"]["p99"] <= ttft_s * 1000 and (result["tpot_ms"] is None
                                                               or result["tpot_ms"]["p99"] <= tpot_s * 1000))


def fewest_replicas(args: argparse.Namespace, config: EngineConfig, limit: int) -> tuple[int | None, dict | None]:
    """Smallest replica count meeting the SLOs (None if ``limit`` does not); its result."""
    def attempt(n: int) -> dict[str, Any]:
        trial = argparse.Namespace(**{**vars(args), "replicas": n, "pd": None})
        return run_one(trial, build_setup(trial, config))

    low, high, best = 0, 1, None
    while high <= limit:
        result = attempt(high)
        if meets(result, args.slo_ttft_p99, args.slo_tpot_p99):
            best = (high, result)
            break
        low, high = high, high * 2
    if best is None:
        return None, None
    high = best[0]
    while high - low > 1:
        mid = (low + high) // 2
        result = attempt(mid)
        if meets(result, args.slo_ttft_p99, args.slo_tpot_p99):
            high, best = mid, (mid, result)
        else:
            low = mid
    return best


def run_sweep(args: argparse.Namespace, config: EngineConfig) -> list[dict[str, Any]]:
    rows = []
    for rate in parse_rates(args.rate):
        for policy in args.policies.split(","):
            for admission in args.admissions.split(","):
                cfg = dataclasses.replace(config, scheduling_policy=policy, admission=admission)
                run_args = argparse.Namespace(**{**vars(args), "request_rate": rate, "goodput": None,
                                                 "percentile_metrics": "ttft,tpot,e2el",
                                                 "metric_percentiles": "50,99"})
                n, result = fewest_replicas(run_args, cfg, args.max_replicas)
                row = {"rate": rate, "policy": policy, "admission": admission, "replicas": n,
                       "ttft_p99_ms": result["ttft_ms"]["p99"] if result else None,
                       "tpot_p99_ms": result["tpot_ms"]["p99"] if result and result["tpot_ms"] else None,
                       "output_tok_s": result["output_tok_s"] if result else None}
                print(f"rate {rate:g}/s {policy}/{admission}: "
                      + (f"{n} replicas (p99 TTFT {row['ttft_p99_ms']:.0f} ms, TPOT {row['tpot_p99_ms']:.1f} ms)"
                         if n else f"more than {args.max_replicas} replicas"))
                rows.append(row)
    if args.output_json:
        write_results(rows, args.output_json)
    if args.plot:
        plot_replicas(rows, Path(args.plot))
    return rows


def plot_replicas(rows: list[dict[str, Any]], folder: Path) -> None:
    """Replicas needed vs rate, one line per policy/admission."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in sorted({(r["policy"], r["admission"]) for r in rows}):
        mine = [r for r in rows if (r["policy"], r["admission"]) == key and r["replicas"]]
        ax.plot([r["rate"] for r in mine], [r["replicas"] for r in mine], "o-", label="/".join(key))
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("replicas meeting the SLOs")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "sim-replicas-vs-rate.png", dpi=100)
    plt.close(fig)
