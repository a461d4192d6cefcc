"""Replicas on one virtual clock: arrivals routed to replicas, steps ending as events, and with
prefill/decode disaggregation (PD) a prompt's KV cache sent from a prefill replica to a decode one.

Events at the same instant go in this order: arrivals, then step ends, then every replica that is
idle with work starts its next step, so a step sees every request that arrived by its start (as
the engine adds the due requests before it schedules).
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from folovllm.request import Request
from folovllm.sampling_params import SamplingParams
from folovllm.simulator.engine import OUTPUT_TOKEN, SimEngine
from folovllm.simulator.recorder import Recorder
from folovllm.simulator.router import make_router
from folovllm.simulator.workload import SimRequest

PARAMS = SamplingParams(temperature=0.0, ignore_eos=True)  # shared: the scheduler only reads its flags


class TrackedRequest(Request):
    """A Request that knows its index in the run and the tokens it produced elsewhere (PD)."""

    def __init__(self, index: int, request_id: str, prompt_token_ids: list[int], arrival: float,
                 max_tokens: int, spec: SimRequest, total_max_tokens: int, outputs_before: int = 0) -> None:
        super().__init__(request_id, prompt_token_ids, PARAMS, arrival, max_tokens, [],
                         priority=spec.priority, user=spec.user)
        self.index, self.spec, self.outputs_before = index, spec, outputs_before
        self.total_max_tokens = total_max_tokens  # under PD: the prefill replica's one token included


@dataclass(frozen=True)
class ClusterSpec:
    """How many replicas, how requests reach them, and PD's pools and KV link."""

    replicas: int = 1
    router: str = "round_robin"
    pd: tuple[int, int] | None = None  # (prefill replicas, decode replicas); replaces ``replicas``
    kv_bytes_per_token: int = 0  # PD: KV cache bytes of one token (all layers)
    kv_link_bandwidth: float = 25e9  # PD: bytes/s from a prefill replica to a decode replica
    kv_link_latency_s: float = 5e-4  # PD: per transfer
    # the API server's own time per request before a replica has it (HTTP, validation, the engine core's
    # inbox): a delay, so requests sent together reach the replica together
    api_server_s: float = 0.0
    # requests sent at the same instant (a burst of N) reach the replica together, later by this much per
    # request after the first, N - 1 times: the client opens a connection and sends each in turn, the
    # server takes each in turn; a lone request pays none of it
    api_server_burst_s: float = 0.0

    def __post_init__(self) -> None:
        if self.pd is None and self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if self.pd is not None and min(self.pd) < 1:
            raise ValueError(f"--pd P:D needs at least one replica in each pool, got {self.pd}")
        if self.pd is not None and self.kv_bytes_per_token <= 0:
            raise ValueError("PD needs the KV bytes per token (--kv-bytes-per-token, or a roofline profile's model)")
        if self.api_server_s < 0 or self.api_server_burst_s < 0:
            raise ValueError(f"the API server's time per request cannot be negative, got {self.api_server_s} "
                             f"and {self.api_server_burst_s} per request of a burst")
        if self.kv_link_bandwidth <= 0:
            raise ValueError(f"the KV link bandwidth must be positive, got {self.kv_link_bandwidth}")


class Cluster:
    """Runs requests through replicas built by ``make_engine(name)``; timings go to ``recorder``."""

    def __init__(self, make_engine: Callable[[str], SimEngine], spec: ClusterSpec, recorder: Recorder) -> None:
        self.spec, self.recorder = spec, recorder
        if spec.pd is None:
            self.front = [make_engine(str(i)) for i in range(spec.replicas)]
            self.decode: list[SimEngine] = []
        else:
            self.front = [make_engine(f"p{i}") for i in range(spec.pd[0])]
            self.decode = [make_engine(f"d{i}") for i in range(spec.pd[1])]
        self.engines = self.front + self.decode
        self.max_model_len = self.engines[0].max_model_len
        self.front_router, self.decode_router = make_router(spec.router), make_router(spec.router)
        # (time, seq, kind, payload); kinds: 0 a step ends, 1 PD's KV arrives, 2 the API server hands a request over
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._ready: list[SimEngine] = []  # idle replicas given work at the current instant
        self._prefill_only = set(map(id, self.front)) if spec.pd else set()

    # -- arrivals ---------------------------------------------------------------------------------

    def _arrive(self, spec: SimRequest, now: float, sent_together: int = 1) -> None:
        """``spec`` is sent at ``now``, with ``sent_together`` requests in all at that instant (itself included)."""
        rec = self.recorder
        rec.start(spec.index, now, spec.prompt_len)
        if spec.prompt_len < 1 or spec.prompt_len >= self.max_model_len:
            rec.fail(spec.index, f"HTTP 400: the prompt has {spec.prompt_len} tokens; max_model_len is "
                                 f"{self.max_model_len}")
            return
        max_tokens = min(spec.output_len, self.max_model_len - spec.prompt_len)
        request = TrackedRequest(spec.index, str(spec.index), spec.prompt_token_ids(), now,
                                 1 if self.spec.pd else max_tokens, spec, max_tokens)
        delay = self.spec.api_server_s + self.spec.api_server_burst_s * (sent_together - 1)
        if delay > 0:  # a latency, not a queue: requests sent together arrive together
            heapq.heappush(self._events, (now + delay, next(self._seq), 2, request))
            return
        self._add(self.front_router.pick(request, self.front), request, rec)

    def _add(self, engine: SimEngine, request: TrackedRequest, rec: Recorder) -> None:
        try:
            engine.add(request)
        except ValueError as err:
            rec.fail(request.index, f"HTTP 400: {err}")
            return
        if not engine.busy and engine not in self._ready:
            self._ready.append(engine)

    # -- steps ------------------------------------------------------------------------------------

    def _on_token(self, request: Request, now: float) -> None:
        self.recorder.token(request.index, request, now)  # type: ignore[attr-defined]

    def _on_finished(self, request: Request, now: float) -> None:
        produced = request.outputs_before + len(request.output_token_ids)  # type: ignore[attr-defined]
        if self.spec.pd and request.outputs_before == 0 and produced < request.total_max_tokens:  # type: ignore[attr-defined]
            size = request.num_prompt_tokens * self.spec.kv_bytes_per_token
            arrive = now + self.spec.kv_link_latency_s + size / self.spec.kv_link_bandwidth
            heapq.heappush(self._events, (arrive, next(self._seq), 1, request))
            return
        self.recorder.finish(request.index, now, produced)  # type: ignore[attr-defined]

    def _start(self, engine: SimEngine, now: float) -> None:
        end = engine.start_step(now)
        if end is not None:
            heapq.heappush(self._events, (end, next(self._seq), 0, engine))

    def _transferred(self, done: TrackedRequest, now: float) -> None:
        """PD: the prompt's KV reached a decode replica; it continues from the first token."""
        ids = done.prompt_token_ids + [OUTPUT_TOKEN]
        request = TrackedRequest(done.index, f"{done.index}-d", ids, done.metrics.arrival_time,
                                 done.total_max_tokens - 1, done.spec, done.total_max_tokens, outputs_before=1)
        request.metrics.first_token_time = done.metrics.first_token_time
        request.metrics.last_token_time = done.metrics.last_token_time
        engine = self.decode_router.pick(request, self.decode)
        receive_kv(engine, done.prompt_token_ids, now)
        self._add(engine, request, self.recorder)

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, requests: list[SimRequest], start: float = 0.0) -> float:
        """Simulates ``requests`` (sorted by arrival; their arrivals are offsets from ``start``, when
        every replica is idle) to the end; returns the last event's time."""
        events, ready = self._events, self._ready
        on_token, on_finished = self._on_token, self._on_finished
        index, now = 0, start
        sent_together = Counter(r.arrival_s for r in requests)
        while True:
            t_arrival = start + requests[index].arrival_s if index < len(requests) else math.inf
            t_event = events[0][0] if events else math.inf
            t_next = min(t_arrival, t_event)
            if ready and t_next > now:
                for engine in ready:
                    self._start(engine, now)
                ready.clear()
                continue
            if t_next == math.inf:
                return now
            now = t_next
            if t_arrival <= t_event:
                self._arrive(requests[index], now, sent_together[requests[index].arrival_s])
                index += 1
                continue
            _, _, kind, payload = heapq.heappop(events)
            if kind == 0:
                engine = payload  # type: ignore[assignment]
                engine.finish_step(now, on_token, on_finished)  # type: ignore[attr-defined]
                engine.busy = False  # type: ignore[attr-defined]
                ready.append(engine)  # type: ignore[arg-type]
            elif kind == 1:
                self._transferred(payload, now)  # type: ignore[arg-type]
            else:  # the API server hands the request over
                self._add(self.front_router.pick(payload, self.front), payload, self.recorder)  # type: ignore[arg-type]


def receive_kv(engine: SimEngine, token_ids: list[int], now: float) -> bool:
    """Names the prompt's full blocks in ``engine``'s prefix cache, as if their K/V had just arrived,
    so the request that follows finds them cached. False if the replica has no room (it recomputes)."""
    carrier = Request("kv-transfer", token_ids, PARAMS, now, 1, [])
    kv = engine.kv_cache
    if not kv.allocate_slots(carrier, len(token_ids)):
        return False
    carrier.num_computed_tokens = len(token_ids)
    kv.cache_computed_blocks(carrier)
    kv.free(carrier)
    return True
