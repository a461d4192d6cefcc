"""The analysis of a background-plus-bursts serving run (benchmarks/pd_burst.py): inter-token
latency of the background streams over time, TTFT of the burst requests, throughput and goodput.

Times are seconds from the run's start (one client clock). A request is *good* when its TTFT and
every one of its inter-token gaps are within the SLOs: one stall longer than the ITL SLO makes the
stream miss it, which is what a burst of long prefills does to the decodes sharing its steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BACKGROUND, BURST = "background", "burst"


@dataclass
class StreamRecord:
    """One request as the client saw it: when it was sent and when each token arrived."""

    kind: str  # BACKGROUND or BURST
    send_s: float
    token_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.token_s[0] - self.send_s if self.token_s else None

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]


def percentiles_ms(values_s: list[float]) -> dict[str, float] | None:
    """p50 / p99 / max (and the count) in ms; None when there are no values."""
    if not values_s:
        return None
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    p50, p99 = np.percentile(ms, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "max": float(ms.max()), "n": int(ms.size)}


def itl_samples(records: list[StreamRecord]) -> list[tuple[float, float]]:
    """(arrival of the later token, gap) for every consecutive token pair of the background streams."""
    return sorted((b, b - a) for r in records if r.kind == BACKGROUND and r.error is None
                  for a, b in zip(r.token_s, r.token_s[1:]))


def itl_over_time(records: list[StreamRecord], window_s: float, duration_s: float) -> list[dict[str, Any]]:
    """Background ITL p50 / p99 / max per window of ``window_s`` (by the later token's arrival);
    windows with no gap are left out."""
    if not window_s > 0:
        raise ValueError(f"the ITL window must be positive, got {window_s}.")
    samples = itl_samples(records)
    rows = []
    for start in np.arange(0.0, max(duration_s, window_s), window_s):
        gaps = [gap for t, gap in samples if start <= t < start + window_s]
        stats = percentiles_ms(gaps)
        if stats:
            rows.append({"t_s": float(start + window_s / 2), **stats})
    return rows


def is_good(record: StreamRecord, ttft_slo_ms: float, itl_slo_ms: float) -> bool:
    if record.error is not None or record.ttft_s is None or record.ttft_s * 1000.0 > ttft_slo_ms:
        return False
    return all(gap * 1000.0 <= itl_slo_ms for gap in record.itls_s)


def summarize_run(records: list[StreamRecord], burst_times_s: list[float], duration_s: float, *,
                  ttft_slo_ms: float, itl_slo_ms: float) -> dict[str, Any]:
    """One run's figures: background ITL and TTFT, burst TTFT (and ITL), output throughput, goodput."""
    if not records:
        raise ValueError("the run recorded no request.")
    ok = [r for r in records if r.error is None]
    background = [r for r in ok if r.kind == BACKGROUND]
    bursts = [r for r in ok if r.kind == BURST]
    end_s = max([t for r in ok for t in r.token_s] + [duration_s])
    good = [r for r in ok if is_good(r, ttft_slo_ms, itl_slo_ms)]
    return {
        "duration_s": end_s,
        "requests": len(records), "failed": len(records) - len(ok),
        "failures": sorted({r.error for r in records if r.error})[:5],
        "bursts": len(burst_times_s), "burst_times_s": burst_times_s,
        "background_requests": len(background),
        "background_itl_ms": percentiles_ms([g for r in background for g in r.itls_s]),
        "background_ttft_ms": percentiles_ms([r.ttft_s for r in background if r.ttft_s is not None]),
        "burst_requests": len(bursts),
        "burst_ttft_ms": percentiles_ms([r.ttft_s for r in bursts if r.ttft_s is not None]),
        "output_tokens": sum(r.output_tokens for r in ok),
        "output_tok_s": sum(r.output_tokens for r in ok) / end_s,
        "slo": {"ttft_ms": ttft_slo_ms, "itl_ms": itl_slo_ms},
        "goodput": {"good_requests": len(good), "good_fraction": len(good) / len(records),
                    "good_req_s": len(good) / end_s,
                    "good_burst_fraction": (sum(r.kind == BURST for r in good) / len(bursts)) if bursts else None},
    }


def _ms(stats: dict[str, float] | None, key: str) -> str:
    return "–" if stats is None else f"{stats[key]:.0f}"


def markdown_table(runs: list[dict[str, Any]]) -> str:
    """One row per run: config, burst interval, background ITL, its p99 against the same config's
    no-burst run, burst TTFT, throughput, goodput."""
    lines = ["| config | bursts every | bg ITL p50 / p99 / max ms | p99 ÷ no-burst p99 | burst TTFT p50 / p99 ms "
             "| KV transfer mean ms / MB | output tok/s | good requests | failed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        itl, ttft = run["background_itl_ms"], run["burst_ttft_ms"]
        ratio = run.get("p99_itl_vs_no_burst")
        interval = "none" if run["burst_interval_s"] is None else f"{run['burst_interval_s']:g} s"
        if run.get("repeats", 1) > 1:
            interval += f" (#{run['repeat'] + 1})"
        kv = run.get("kv_transfer") or {}
        transfer = (f"{kv['mean_ms']:.0f} / {kv['mean_mb']:.1f} ({kv['transfers']})" if kv.get("transfers")
                    else "–")
        lines.append(
            f"| {run['config']} | {interval} | {_ms(itl, 'p50')} / {_ms(itl, 'p99')} / {_ms(itl, 'max')} | "
            f"{'–' if ratio is None else f'{ratio:.2f}×'} | {_ms(ttft, 'p50')} / {_ms(ttft, 'p99')} | {transfer} | "
            f"{run['output_tok_s']:.1f} | {run['goodput']['good_fraction']:.0%} | {run['failed']} |")
    return "\n".join(lines)


def add_no_burst_ratios(runs: list[dict[str, Any]]) -> None:
    """Each burst run's background ITL p99 over its config's no-burst p99 (``p99_itl_vs_no_burst``),
    the no-burst run of the same repeat (``repeat``, 0 when absent)."""
    baseline = {(r["config"], r.get("repeat", 0)): r["background_itl_ms"] for r in runs
                if r["burst_interval_s"] is None}
    for run in runs:
        base, own = baseline.get((run["config"], run.get("repeat", 0))), run["background_itl_ms"]
        run["p99_itl_vs_no_burst"] = (own["p99"] / base["p99"] if run["burst_interval_s"] is not None
                                      and base and own and base["p99"] > 0 else None)


def median_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config and burst interval: the p99 ratio of every repeat and their median (the ratios
    themselves come from ``add_no_burst_ratios``)."""
    groups: dict[tuple[str, float], list[float]] = {}
    for run in runs:
        if run["burst_interval_s"] is not None and run.get("p99_itl_vs_no_burst") is not None:
            groups.setdefault((run["config"], run["burst_interval_s"]), []).append(run["p99_itl_vs_no_burst"])
    return [{"config": config, "burst_interval_s": interval, "ratios": ratios,
             "median_ratio": float(np.median(ratios))} for (config, interval), ratios in groups.items()]


def median_table(summary: list[dict[str, Any]]) -> str:
    """One row per config and burst interval: the median p99 ratio over repeats, and each repeat's."""
    lines = ["| config | bursts every | p99 ÷ no-burst p99, median | each repeat |", "|---|---|---|---|"]
    for row in summary:
        each = ", ".join(f"{r:.2f}×" for r in row["ratios"])
        lines.append(f"| {row['config']} | {row['burst_interval_s']:g} s | {row['median_ratio']:.2f}× | {each} |")
    return "\n".join(lines)


def plot_itl_timelines(runs: list[dict[str, Any]], png_path: str | Path) -> None:
    """One panel per run (its ``itl_over_time`` rows): background ITL p50 / p99 / max over time,
    each burst a vertical line."""
    from folovllm.bench.plots import plt

    if not runs:
        raise ValueError("no run to plot.")
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.8 * len(runs)), squeeze=False, sharex=True)
    for ax, run in zip(axes[:, 0], runs):
        rows = run["itl_over_time"]
        t = [r["t_s"] for r in rows]
        for key, style in (("p50", "-"), ("p99", "--"), ("max", ":")):
            ax.plot(t, [r[key] for r in rows], style, label=f"ITL {key}")
        for i, burst in enumerate(run["burst_times_s"]):
            ax.axvline(burst, color="red", alpha=0.35, label="burst sent" if i == 0 else None)
        interval = "no bursts" if run["burst_interval_s"] is None else f"bursts every {run['burst_interval_s']:g} s"
        ax.set_title(f"{run['config']}: {interval}", fontsize=10)
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("time since the run's start (s)")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
