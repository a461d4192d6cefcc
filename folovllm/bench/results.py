"""Benchmark result dicts (the JSON format docs/benchmarks.md reads), latency statistics, peak RSS and console printing."""
from __future__ import annotations

import json
import resource
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from folovllm.platforms import platform_for

LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


@dataclass
class RequestTiming:
    """Client-side timestamps of one request (seconds, one clock). None where a run cannot observe it."""

    num_prompt_tokens: int
    num_output_tokens: int
    arrival_time: float
    finished_time: float
    first_token_time: float | None = None
    # Receive time of every output token, for ITL; empty when the run does not stream.
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2el(self) -> float:
        return self.finished_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """(e2e − ttft) / (output_tokens − 1); undefined for one output token."""
        if self.ttft is None or self.num_output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.num_output_tokens - 1)


def bench_command(name: str) -> str | None:
    """The ``folovllm bench <name> ...`` command line this process runs, for a result to hold; None when the
    process is not that command (a test or a script calling the benchmark's function)."""
    return shlex.join(["folovllm", "bench", name, *sys.argv[3:]]) if sys.argv[1:3] == ["bench", name] else None


def latency_stats(values_s: list[float]) -> dict[str, float] | None:
    """Mean / p50 / p90 / p99 in milliseconds of latencies in seconds; None when there are none."""
    if not values_s:
        return None
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"mean": float(ms.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def read_peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def reset_peak_rss() -> bool:
    """Reset the peak-RSS mark to the current RSS (Linux ≥ 4.0) so each phase reports its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class CpuShare:
    """Fraction of ``threads`` cores this process got over a span: below ~0.9 means others competed for the CPU."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def stop(self) -> float:
        wall = time.perf_counter() - self._wall
        return (time.process_time() - self._cpu) / (wall * self.threads) if wall > 0 else 0.0


def kv_cache_summary(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    """The result's kv_cache object from ``LLM.get_kv_cache_stats()``, plus slot utilization.

    slot_utilization = tokens stored / slots in the blocks held, at the peak: how much paging wastes.
    """
    if stats is None:
        return None
    block_size = int(stats["block_size"])
    peak_blocks = int(stats["peak_blocks_used"])
    peak_slots = int(stats["peak_used_slots"])
    held = peak_blocks * block_size
    return {
        "num_blocks": int(stats["num_blocks"]),
        "block_size": block_size,
        "peak_usage": float(stats["peak_usage"]),
        "peak_blocks_used": peak_blocks,
        "peak_used_slots": peak_slots,
        "slot_utilization": peak_slots / held if held else None,
    }


def platform_info(device: str) -> dict[str, str] | None:
    """What a local device is (a CPU: its model and tier, ``Platform.describe``); None for a remote server."""
    try:
        return platform_for(device).describe()
    except (RuntimeError, ValueError, AssertionError):  # "remote", or a device this process does not have
        return None


def build_result(
    *,
    name: str,
    engine: str,
    model: str,
    dtype: str,
    device: str,
    config: dict[str, Any],
    timings: list[RequestTiming],
    duration_s: float,
    peak_memory_mb: float | None,
    kv_cache: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One result object. Throughputs are over ``duration_s`` (first send → last finish).

    Latency fields are None where no request carries the needed timestamps; ``extra`` holds
    run-specific figures outside the common result format (e.g. tokens computed but not useful).
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}.")
    input_tokens = sum(t.num_prompt_tokens for t in timings)
    output_tokens = sum(t.num_output_tokens for t in timings)
    itls = [b - a for t in timings for a, b in zip(t.token_times, t.token_times[1:])]
    return {
        "name": name,
        "engine": engine,
        "model": model,
        "dtype": dtype,
        "device": device,
        "platform": platform_info(device),
        "config": config,
        "num_requests": len(timings),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "duration_s": duration_s,
        "request_throughput": len(timings) / duration_s,
        "input_tok_s": input_tokens / duration_s,
        "output_tok_s": output_tokens / duration_s,
        "total_tok_s": (input_tokens + output_tokens) / duration_s,
        "ttft_ms": latency_stats([t.ttft for t in timings if t.ttft is not None]),
        "tpot_ms": latency_stats([t.tpot for t in timings if t.tpot is not None]),
        "itl_ms": latency_stats(itls),
        "e2el_ms": latency_stats([t.e2el for t in timings]),
        "peak_memory_mb": peak_memory_mb,
        "kv_cache": kv_cache,
        "extra": extra or {},
    }


def prefill_tok_s(timings: list[RequestTiming]) -> float | None:
    """Input tokens / time until every request has its first token: the batch's prefill rate."""
    if not timings or any(t.first_token_time is None for t in timings):
        return None
    start = min(t.arrival_time for t in timings)
    span = max(t.first_token_time for t in timings) - start  # type: ignore[type-var]
    return sum(t.num_prompt_tokens for t in timings) / span if span > 0 else None


def write_results(results: list[dict[str, Any]], path: str | Path) -> None:
    """Write the list of result objects as JSON."""
    Path(path).write_text(json.dumps(results, indent=2) + "\n")


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def format_result(result: dict[str, Any]) -> str:
    """Console report in the style of vLLM's benchmark."""
    width = 50
    lines = [f" {result['name']} · {result['engine']} ".center(width, "=")]

    def row(label: str, value: str) -> None:
        lines.append(f"{label:<40}{value}")

    row("Successful requests:", str(result["num_requests"]))
    row("Benchmark duration (s):", _fmt(result["duration_s"]))
    row("Input tokens:", f"{result['input_tokens']:,} ({_fmt(result['input_tok_s'], 1)} tok/s)")
    row("Output tokens:", f"{result['output_tokens']:,} ({_fmt(result['output_tok_s'], 1)} tok/s)")
    row("Request throughput (req/s):", _fmt(result["request_throughput"]))
    row("Total token throughput (tok/s):", _fmt(result["total_tok_s"], 1))
    for key, title in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL")):
        stats = result[key]
        if stats is None:
            continue
        lines.append(f" {title} (ms) ".center(width, "-"))
        row(f"Mean / P50 / P90 / P99 {title}:", " / ".join(_fmt(stats[k], 1) for k in ("mean", "p50", "p90", "p99")))
    lines.append("-" * width)
    if result["peak_memory_mb"] is not None:
        row("Peak RSS (MiB):", _fmt(result["peak_memory_mb"], 0))
    kv = result["kv_cache"]
    if kv is not None:
        blocks = f"{kv['peak_blocks_used']} / {kv['num_blocks']} ({kv['peak_usage']:.1%})"
        row("KV cache blocks (peak / total):", blocks)
        util = kv["slot_utilization"]
        row("KV slots used at peak:", f"{kv['peak_used_slots']:,} of {kv['peak_blocks_used'] * kv['block_size']:,}"
            + ("" if util is None else f" ({util:.1%})"))
    for key, value in result["extra"].items():
        row(f"{key}:", _fmt(value) if isinstance(value, float) else str(value))
    lines.append("=" * width)
    return "\n".join(lines)


def ratio_rows(
    ours: dict[str, Any], baseline: dict[str, Any], metrics: list[str]
) -> list[tuple[str, float | None, float | None, float | None]]:
    """(metric, ours, theirs, ours/theirs) for each metric, read from the result or its ``extra``."""
    rows = []
    for metric in metrics:
        a = ours.get(metric, ours["extra"].get(metric))
        b = baseline.get(metric, baseline["extra"].get(metric))
        rows.append((metric, a, b, a / b if a is not None and b else None))
    return rows


def format_ratio_table(ours: dict[str, Any], baselines: list[dict[str, Any]], metrics: list[str]) -> str:
    """Table of ours / theirs per baseline and metric (ratio > 1 means we are faster)."""
    header = f"{'baseline':<16}{'metric':<22}{'ours':>12}{'theirs':>12}{'ours/theirs':>13}"
    lines = [header, "-" * len(header)]
    for base in baselines:
        for metric, a, b, ratio in ratio_rows(ours, base, metrics):
            ratio_text = "n/a" if ratio is None else f"{ratio:.2f}x"
            lines.append(f"{base['engine']:<16}{metric:<22}{_fmt(a, 1):>12}{_fmt(b, 1):>12}{ratio_text:>13}")
    return "\n".join(lines)
