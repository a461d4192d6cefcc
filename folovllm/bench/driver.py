"""Feeds the offline engine requests at their arrival times and records what happened to each."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from folovllm.bench.arrivals import poisson_arrivals  # noqa: F401  (re-exported for the drivers' callers)
from folovllm.engine.run_loop import run_until_finished
from folovllm.outputs import RequestOutput
from folovllm.sampling_params import SamplingParams


@dataclass
class TimedRequest:
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_s: float  # offset from the start of the run
    priority: int = 0
    user: str | None = None
    tag: str = ""  # class label for per-class breakdowns (e.g. "short" / "long", "high" / "low")


@dataclass
class RequestRecord:
    tag: str
    arrival: float
    first_scheduled: float
    first_token: float
    finished: float
    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def queue_delay(self) -> float:
        return self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2el(self) -> float:
        return self.finished - self.arrival


@dataclass
class RunTrace:
    """Per-run engine figures collected step by step."""

    duration_s: float = 0.0
    steps: int = 0
    peak_running: int = 0
    mean_running: float = 0.0
    peak_kv_usage: float = 0.0
    preemptions: int = 0


def drive(engine: Any, requests: list[TimedRequest]) -> tuple[list[RequestRecord], RunTrace]:
    """Adds each request at its arrival offset and steps until all finish."""
    trace = RunTrace()
    preempted_before = engine.stats.num_preemptions
    running_sum = 0
    start = time.perf_counter()
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    pending = [requests[i] for i in order]
    ids: dict[str, TimedRequest] = {}

    def add_due() -> list[str] | None:
        if not pending:
            return None
        now = time.perf_counter() - start
        added = []
        while pending and pending[0].arrival_s <= now:
            req = pending.pop(0)
            rid = engine.add_request({"prompt_token_ids": req.prompt_token_ids}, req.params,
                                     arrival_time=start + req.arrival_s, priority=req.priority, user=req.user)
            ids[rid] = req
            added.append(rid)
        if not added and not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival_s - now))
        return added

    def record_step(outputs: list[RequestOutput]) -> None:
        nonlocal running_sum
        step = engine.stats.last_step
        if step is not None:
            trace.steps += 1
            running_sum += step.num_running
            trace.peak_running = max(trace.peak_running, step.num_running)
            trace.peak_kv_usage = max(trace.peak_kv_usage, step.kv_usage)

    finished = run_until_finished(engine, [], arrivals=add_due, on_step=record_step)
    trace.duration_s = time.perf_counter() - start
    trace.mean_running = running_sum / max(1, trace.steps)
    trace.preemptions = engine.stats.num_preemptions - preempted_before
    records = []
    for rid, req in ids.items():
        out = finished[rid]
        m = out.metrics
        records.append(RequestRecord(req.tag, m.arrival_time, m.first_scheduled_time, m.first_token_time,
                                     m.finished_time, len(out.prompt_token_ids), len(out.outputs[0].token_ids)))
    return records, trace


def summarize(records: list[RequestRecord]) -> dict[str, Any]:
    """Latency percentiles in ms (TTFT, E2EL, queueing delay) and output throughput inputs."""
    def stats(values: list[float]) -> dict[str, float]:
        arr = np.asarray(values) * 1000
        return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)),
                "p90": float(np.percentile(arr, 90)), "p99": float(np.percentile(arr, 99)),
                "max": float(arr.max())}

    return {"num_requests": len(records),
            "ttft_ms": stats([r.ttft for r in records]),
            "e2el_ms": stats([r.e2el for r in records]),
            "queue_delay_ms": stats([r.queue_delay for r in records]),
            "output_tokens": sum(r.num_output_tokens for r in records)}
