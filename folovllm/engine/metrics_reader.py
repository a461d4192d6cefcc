"""The engine's counters and gauges as metric objects (vLLM's ``LLM.get_metrics()`` shape).

Names are those of the server's /metrics (``folovllm:`` prefix, vLLM's names after it).
"""
from __future__ import annotations

from dataclasses import dataclass

from folovllm.engine.stats import EngineStats

# EngineStats counter field -> metric name (without prefix), as /metrics names them
COUNTER_FIELDS = ("prompt_tokens", "generation_tokens", "num_preemptions", "prefix_cache_queries",
                  "prefix_cache_hits")


@dataclass
class Metric:
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Gauge(Metric):
    value: float


def engine_metrics(stats: EngineStats, num_running: int, num_waiting: int, kv_usage: float,
                   model_name: str) -> list[Metric]:
    """A snapshot: queue and KV gauges, token and prefix-cache counters, finished requests by reason."""
    labels = {"model_name": model_name}
    metrics: list[Metric] = [
        Gauge("folovllm:num_requests_running", labels, num_running),
        Gauge("folovllm:num_requests_waiting", labels, num_waiting),
        Gauge("folovllm:kv_cache_usage_perc", labels, kv_usage),
    ]
    metrics += [Counter(f"folovllm:{name}", labels, getattr(stats, name)) for name in COUNTER_FIELDS]
    metrics += [Counter("folovllm:request_success", {**labels, "finished_reason": reason}, count)
                for reason, count in sorted(stats.finished_by_reason.items())]
    return metrics
