"""The ``simulate sweep --plot`` figures, drawn from the sweep's rows: replicas needed vs rate, latency
percentiles vs rate per configuration, and goodput per prefill:decode ratio."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the machines sweeps run on
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, plt: Any, png_path: Path) -> None:
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def plot_replicas(rows: list[dict[str, Any]], png_path: Path) -> None:
    """Replicas needed vs rate, one line per policy/admission (the ``fewest_replicas`` rows)."""
    plt = _pyplot()
    rows = [r for r in rows if r.get("kind", "fewest_replicas") == "fewest_replicas"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in sorted({(r["policy"], r["admission"]) for r in rows}):
        mine = [r for r in rows if (r["policy"], r["admission"]) == key and r["replicas"]]
        ax.plot([r["rate"] for r in mine], [r["replicas"] for r in mine], "o-", label="/".join(key))
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("replicas meeting the SLOs")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, plt, png_path)


def plot_latency_vs_rate(rows: list[dict[str, Any]], png_path: Path) -> None:
    """p50 (solid) and p99 (dashed) TTFT and TPOT vs request rate, one colour per configuration (replica
    count, and policy/admission when the sweep has several); log scale, since overload costs seconds."""
    plt = _pyplot()
    rows = [r for r in rows if r.get("kind") == "fixed_replicas"]
    modes = sorted({(r["policy"], r["admission"]) for r in rows})
    configs = sorted({(r["replicas"], r["policy"], r["admission"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (replicas, policy, admission) in enumerate(configs):
        config = (replicas, policy, admission)
        mine = sorted((r for r in rows if (r["replicas"], r["policy"], r["admission"]) == config),
                      key=lambda r: r["rate"])
        name = f"{replicas} replica{'s' if replicas > 1 else ''}" + (f" {policy}/{admission}" if len(modes) > 1 else "")
        for ax, metric in zip(axes, ("ttft", "tpot")):
            for stat, style in (("p50", "o-"), ("p99", "s--")):
                points = [(r["rate"], r[f"{metric}_{stat}_ms"]) for r in mine if r[f"{metric}_{stat}_ms"] is not None]
                ax.plot([p[0] for p in points], [p[1] for p in points], style, color=colours[i % len(colours)],
                        label=f"{name} {stat}")
    for ax, title in zip(axes, ("TTFT", "TPOT")):
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(f"{title}: p50 solid, p99 dashed")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    _save(fig, plt, png_path)


def plot_pd_goodput(rows: list[dict[str, Any]], png_path: Path) -> None:
    """Left: goodput (offered rate x share of good requests) per prefill:decode ratio at each fixed total
    of instances, a dotted line for the same total colocated. Right: the fewest instances meeting the
    SLOs per ratio."""
    plt = _pyplot()
    fixed = [r for r in rows if r.get("kind") == "pd_fixed"]
    fewest = [r for r in rows if r.get("kind") == "pd_fewest"]
    ratios = list(dict.fromkeys(r["ratio"] for r in fewest + fixed if r["prefill"] is not None))
    where = {ratio: i for i, ratio in enumerate(ratios, start=1)}
    where["colocated"] = 0
    groups = sorted({(r["rate"], r["policy"], r["admission"]) for r in fewest + fixed})
    many = len(groups) > 1
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    line = 0
    for group in groups:
        tag = " @{:g}/s {}/{}".format(*group) if many else ""
        mine = [r for r in fixed if (r["rate"], r["policy"], r["admission"]) == group]
        for total in sorted({r["instances"] for r in mine}):
            colour = colours[line % len(colours)]
            line += 1
            at_total = [r for r in mine if r["instances"] == total]
            split = [r for r in at_total if r["prefill"] is not None]
            axes[0].plot([where[r["ratio"]] for r in split], [_num(r["good_rate_req_s"]) for r in split], "o-",
                         color=colour, label=f"{total} instances{tag}")
            for r in at_total:
                if r["prefill"] is None:
                    axes[0].axhline(_num(r["good_rate_req_s"]), color=colour, linestyle=":",
                                    label=f"{total} colocated{tag}")
        best = sorted((r for r in fewest if (r["rate"], r["policy"], r["admission"]) == group),
                      key=lambda r: where[r["ratio"]])
        axes[1].plot([where[r["ratio"]] for r in best], [_num(r["instances"]) for r in best], "s-",
                     label=f"fewest meeting the SLOs{tag}")
    axes[0].set_xticks(range(1, len(ratios) + 1), ratios)
    axes[0].set_ylabel("goodput (req/s within the SLOs)")
    axes[1].set_xticks(range(len(ratios) + 1), ["colocated", *ratios])
    axes[1].set_ylabel("instances")
    for ax in axes:
        ax.set_xlabel("prefill:decode ratio")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, plt, png_path)


def _num(value: float | None) -> float:
    return float("nan") if value is None else value
