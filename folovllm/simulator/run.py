"""One simulated run: requests through a cluster of replicas, timings recorded."""
from __future__ import annotations

from dataclasses import dataclass, replace

from folovllm.simulator.cluster import Cluster
from folovllm.simulator.engine import SimEngine
from folovllm.simulator.recorder import Recorder
from folovllm.simulator.setup import SimSetup
from folovllm.simulator.workload import SimRequest


@dataclass
class SimRun:
    recorder: Recorder
    cluster: Cluster
    end_s: float  # virtual time of the last event

    def stats(self) -> dict:
        """Per-run figures beyond latency: steps, preemptions, prefix-cache hits, replica utilization."""
        engines = self.cluster.engines
        queries = sum(e.kv_cache.prefix_cache_queries for e in engines)
        hits = sum(e.kv_cache.prefix_cache_hits for e in engines)
        return {"replicas": len(engines), "steps": sum(e.num_steps for e in engines),
                "preemptions": sum(e.scheduler.num_preemptions for e in engines),
                "prefix_cache_hit_rate": hits / queries if queries else 0.0,
                "peak_kv_usage": max(e.kv_cache.peak_blocks_used / e.kv_cache.num_blocks for e in engines),
                "mean_utilization": (sum(e.busy_s for e in engines) / (len(engines) * self.end_s)
                                     if self.end_s > 0 else 0.0)}


# tokens of the check request ``bench serve`` sends before it times anything
CHECK_MAX_TOKENS = 4


def check_request(requests: list[SimRequest]) -> SimRequest | None:
    """What ``bench serve`` sends and waits for before its timed run: the dataset's first request, cut
    to a few tokens. It leaves that prompt in the prefix cache, so the timed copy finds it there."""
    first = min(requests, key=lambda r: r.index, default=None)
    if first is None:
        return None
    return replace(first, index=0, arrival_s=0.0, output_len=min(first.output_len, CHECK_MAX_TOKENS))


def simulate(setup: SimSetup, requests: list[SimRequest], keep_token_times: bool = False,
             keep_steps: bool = False, with_check_request: bool = False) -> SimRun:
    """Runs ``requests`` (sorted by arrival) on ``setup``'s cluster to the end. ``with_check_request``:
    first the check request ``bench serve`` sends, to its end (not recorded); the timed requests
    arrive from then on, on the state it left (its prompt cached)."""
    def make_engine(name: str) -> SimEngine:
        return SimEngine(setup.config, setup.num_blocks, setup.max_model_len, setup.cost, name, keep_steps)

    recorder = Recorder(len(requests), keep_token_times)
    cluster = Cluster(make_engine, setup.cluster, Recorder(1))
    start = 0.0
    probe = check_request(requests) if with_check_request else None
    if probe is not None:
        start = cluster.run([probe])
    cluster.recorder = recorder
    end = cluster.run(requests, start)
    return SimRun(recorder, cluster, end)
