"""Prometheus metrics with vLLM's names (``folovllm:`` prefix), on a per-app registry.

Fed on the event loop after every engine iteration: counters from EngineStats deltas, gauges from the
engine's snapshot (scheduler queues, KV cache), histograms from the RequestOutputs of that step.
Requests that end early are counted too: aborted ones (client gone, drain timeout) in
``request_success_total{finished_reason="abort"}``, engine faults under ``"error"``, and error responses
given before a request reached the engine in ``request_rejected_total{status=...}``.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from folovllm.engine.core_loop import EngineSnapshot
from folovllm.entrypoints.openai.serving import REACHED_ENGINE
from folovllm.outputs import RequestOutput

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# EngineStats counter field -> metric name (without prefix and _total)
_COUNTERS = {"prompt_tokens": "prompt_tokens", "generation_tokens": "generation_tokens",
             "num_preemptions": "num_preemptions", "prefix_cache_queries": "prefix_cache_queries",
             "prefix_cache_hits": "prefix_cache_hits"}
_PROBES = ("/health", "/metrics")  # their error statuses describe the server, not a rejected request


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels, values = ["model_name"], [model_name]
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"folovllm:{name}", doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(f"folovllm:{name}", doc, labels, buckets=buckets, registry=r).labels(*values)

        self.num_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).")
        self.counters = {field: Counter(f"folovllm:{name}", f"{name.replace('_', ' ')} (total).",
                                        labels, registry=r).labels(*values)
                         for field, name in _COUNTERS.items()}
        self._success = Counter("folovllm:request_success", "Finished requests by finish reason.",
                                labels + ["finished_reason"], registry=r)
        self._rejected = Counter("folovllm:request_rejected",
                                 "Requests answered with an error status before reaching the engine.",
                                 labels + ["status"], registry=r)
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first token.", _LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between output tokens.",
                             _LATENCY_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds", "Arrival to first scheduling.",
                                    _LATENCY_BUCKETS)
        self.iteration_tokens = histogram("iteration_tokens_total", "Tokens computed per step.",
                                          _TOKEN_BUCKETS)
        self._model_name = model_name
        self._seen: dict[str, int] = {}  # counter snapshots (EngineStats fields, finish reasons)
        self._last_step_time: float | None = None
        self._last_token_time: dict[str, float] = {}  # request id -> when its latest token came

    def on_iteration(self, snap: EngineSnapshot, outputs: list[RequestOutput], ended: list[str]) -> None:
        """The AsyncLLMEngine hook: one engine iteration's snapshot, outputs and aborted request ids."""
        stats = snap.stats
        for field, counter in self.counters.items():
            self._inc(field, counter, getattr(stats, field))
        for reason, total in list(stats.finished_by_reason.items()):
            self._inc(f"finished:{reason}", self._success.labels(self._model_name, reason), total)
        self.num_running.set(snap.num_running)
        self.num_waiting.set(snap.num_waiting)
        self.kv_usage.set(snap.kv_usage)
        step = stats.last_step
        if step is not None and step.time != self._last_step_time:
            self._last_step_time = step.time
            self.iteration_tokens.observe(step.num_prefill_tokens + step.num_decode_tokens)
        for output in outputs:
            self._observe_request(output)
        for request_id in ended:  # aborted requests end without a finished output
            self._last_token_time.pop(request_id, None)

    def count_rejected(self, status: int) -> None:
        self._rejected.labels(self._model_name, str(status)).inc()

    def reset_gauges(self) -> None:
        """The engine is gone: nothing runs, waits or holds KV blocks any more."""
        for gauge in (self.num_running, self.num_waiting, self.kv_usage):
            gauge.set(0)

    def _inc(self, key: str, counter, total: float) -> None:
        delta = total - self._seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
        self._seen[key] = total

    def _observe_request(self, output: RequestOutput) -> None:
        m = output.metrics
        now = m.last_token_time or time.perf_counter()
        previous = self._last_token_time.get(output.request_id)
        if previous is None:
            if m.first_token_time is not None:
                self.ttft.observe(m.first_token_time - m.arrival_time)
            if m.first_scheduled_time is not None:
                self.queue_time.observe(m.first_scheduled_time - m.arrival_time)
        else:
            self.itl.observe(now - previous)
        if output.finished:
            self._last_token_time.pop(output.request_id, None)
            if m.finished_time is not None:
                self.e2e.observe(m.finished_time - m.arrival_time)
        else:
            self._last_token_time[output.request_id] = now

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RejectionCounter:
    """ASGI middleware: counts every error response (status >= 400) given to a request before it
    reached the engine (validation 400, 401, 404, 413, 503 busy or draining), by status."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in _PROBES:
            await self.app(scope, receive, send)
            return

        async def counting_send(message) -> None:
            if (message["type"] == "http.response.start" and message["status"] >= 400
                    and not scope.get(REACHED_ENGINE)):
                self.metrics.count_rejected(message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)
