"""PNG plots for the benchmarks (matplotlib, Agg backend: no display needed).

- ``plot_latency_cdfs``: one run's TTFT, TPOT / ITL and E2EL distributions.
- ``plot_sweep``: throughput vs latency over a ``--sweep-rates`` run.
- ``plot_step_timeline``: the engine's step trace (JSONL) over time: running / waiting requests,
  prefill vs decode tokens per step, KV cache usage.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

STEP_TRACE_FIELDS = ("time", "num_prefill_tokens", "num_decode_tokens", "num_running", "num_waiting",
                     "num_preempted", "kv_blocks_used", "kv_usage")


def _cdf(ax: Any, values: list[float], label: str) -> None:
    if values:
        xs = np.sort(np.asarray(values, dtype=np.float64))
        ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=f"{label} (n={xs.size})")


def plot_latency_cdfs(samples_ms: dict[str, list[float]], png_path: str | Path, title: str = "") -> None:
    """CDFs of ``ttft_ms``, ``tpot_ms`` with ``itl_ms``, and ``e2el_ms`` (lists of ms; missing = empty)."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = ((("ttft_ms", "TTFT"),), (("tpot_ms", "TPOT"), ("itl_ms", "ITL")), (("e2el_ms", "E2EL"),))
    for ax, panel in zip(axes, panels):
        for key, label in panel:
            _cdf(ax, samples_ms.get(key, []), label)
        ax.set_xlabel(" / ".join(label for _, label in panel) + " (ms)")
        ax.set_ylabel("CDF")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="lower right")
    fig.suptitle(title or "latency CDFs")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def plot_sweep(results: list[dict[str, Any]], png_path: str | Path) -> None:
    """Output throughput (x) vs TTFT / TPOT / E2EL p50 and p99 (y), one point per run, labelled with
    the offered request rate (``config.request_rate``)."""
    runs = sorted(results, key=lambda r: r["output_tok_s"])
    xs = [r["output_tok_s"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, title) in zip(axes, (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2EL"))):
        for stat, style in (("p50", "o-"), ("p99", "s--")):
            ys = [np.nan if r[key] is None else r[key][stat] for r in runs]
            ax.plot(xs, ys, style, label=f"{title} {stat}")
        for x, run in zip(xs, runs):
            y = run[key]["p50"] if run[key] is not None else None
            if y is not None:
                ax.annotate(f"{run['config'].get('request_rate', '?')}/s", (x, y), fontsize=8,
                            textcoords="offset points", xytext=(4, 4))
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(f"{title} (ms)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("throughput vs latency (labels: offered request rate)")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def read_step_trace(trace_jsonl_path: str | Path) -> dict[str, np.ndarray]:
    """The trace's columns; ValueError naming the line for a record that is not JSON or lacks a field."""
    rows = []
    with open(trace_jsonl_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                rows.append([float(record[k]) for k in STEP_TRACE_FIELDS])
            except json.JSONDecodeError as err:
                raise ValueError(f"{trace_jsonl_path}:{lineno}: not valid JSON ({err.msg})") from None
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{trace_jsonl_path}:{lineno}: a step record needs numeric "
                                 f"{', '.join(STEP_TRACE_FIELDS)} ({err!r})") from None
    if not rows:
        raise ValueError(f"{trace_jsonl_path}: no step records.")
    table = np.asarray(rows)
    return {k: table[:, i] for i, k in enumerate(STEP_TRACE_FIELDS)}


def plot_step_timeline(trace_jsonl_path: str | Path, png_path: str | Path) -> None:
    """Three stacked panels over time since the first step: requests running / waiting (and preempted
    in the step), prefill vs decode tokens per step, KV cache usage."""
    trace = read_step_trace(trace_jsonl_path)
    t = trace["time"] - trace["time"][0]
    fig, (ax_req, ax_tok, ax_kv) = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    ax_req.step(t, trace["num_running"], where="post", label="running")
    ax_req.step(t, trace["num_waiting"], where="post", label="waiting")
    if trace["num_preempted"].any():
        ax_req.step(t, trace["num_preempted"], where="post", label="preempted")
    ax_req.set_ylabel("requests")
    ax_tok.stackplot(t, trace["num_prefill_tokens"], trace["num_decode_tokens"], step="post",
                     labels=["prefill tokens", "decode tokens"], alpha=0.8)
    ax_tok.set_ylabel("tokens per step")
    ax_kv.plot(t, trace["kv_usage"] * 100.0, label="KV cache usage")
    ax_kv.set_ylabel("KV usage (%)")
    ax_kv.set_ylim(0, 105)
    ax_kv.set_xlabel("time since the first step (s)")
    for ax in (ax_req, ax_tok, ax_kv):
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    fig.suptitle(f"engine steps ({len(t)})")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
