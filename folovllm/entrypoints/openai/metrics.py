"""Prometheus metrics with vLLM's names, types, labels and buckets, on a per-app registry.

Dashboards, autoscaler rules and alerts written for vLLM read this server unchanged: the prefix is
``vllm:`` by default (``--metrics-prefix folovllm`` for ours), engine series carry ``model_name`` and
``engine`` labels (one series per data-parallel replica, ``engine="0"``, ``"1"``, ...; a sum over
``engine`` is the server's total), counters end in ``_total``, and no ``_created`` series are exported.

Fed on the event loop after every engine iteration: counters from EngineStats deltas, gauges from the
engine's snapshot (scheduler queues, KV cache), histograms from the RequestOutputs of that step.
Timings come from the engine core's per-request timestamps (RequestMetrics), all time.perf_counter:

    queue    = first scheduled - queued in the engine     prefill   = first token - first scheduled
    decode   = last token - first token                    inference = last token - first scheduled
    TTFT     = first token - arrival at the server         e2e       = finish seen here - arrival

A user request (one prompt, all its ``n`` samples) is one observation in each request histogram;
``request_success_total`` counts each sample by its finish reason, as vLLM counts each engine request.
Aborted requests (client gone, drain timeout) count under ``finished_reason="abort"``, engine faults
under ``"error"``; error responses given before a request reached the engine count in the
server-only ``request_rejected_total{status}``.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import disable_created_metrics

from folovllm.engine.core_loop import EngineSnapshot
from folovllm.entrypoints.openai.middleware import route_path
from folovllm.entrypoints.openai.serving import REACHED_ENGINE
from folovllm.outputs import RequestOutput
from folovllm.sampling_params import SamplingParams

METRICS_PREFIXES = ("vllm", "folovllm")
FINISH_REASONS = ("stop", "length", "abort", "error")
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                          7.5, 10.0, 20.0, 40.0, 80.0)
_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                            50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_N_BUCKETS = (1, 2, 5, 10, 20)
# EngineStats counter field -> metric name (without prefix and _total)
_COUNTERS = {"prompt_tokens": "prompt_tokens", "generation_tokens": "generation_tokens",
             "num_preemptions": "num_preemptions", "prefix_cache_queries": "prefix_cache_queries",
             "prefix_cache_hits": "prefix_cache_hits",
             # PD disaggregation (a server with --kv-role): prompt tokens asked of / found at the producer
             "external_prefix_cache_queries": "external_prefix_cache_queries",
             "external_prompt_tokens": "external_prefix_cache_hits",
             # FoloVLLM's own: KV pulls done and failed (recomputed locally), held KV handed out or timed out
             "kv_transfer_loads": "kv_transfer_loads", "kv_transfer_load_failures": "kv_transfer_load_failures",
             "kv_transfer_sends": "kv_transfer_sends",
             "kv_transfer_recv_bytes": "kv_transfer_recv_bytes",
             "kv_transfer_recv_seconds": "kv_transfer_recv_seconds",
             # speculative decoding (zero while it is off)
             "spec_decode_num_drafts": "spec_decode_num_drafts",
             "spec_decode_num_draft_tokens": "spec_decode_num_draft_tokens",
             "spec_decode_num_accepted_tokens": "spec_decode_num_accepted_tokens"}
PROBE_PATHS = ("/health", "/ping", "/metrics", "/load", "/version")  # their statuses describe the server


def token_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (request sizes, in tokens)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class EngineSeries:
    """One engine replica's children of the metric families (``engine="r"``) and what it last reported."""

    def __init__(self, families: dict, model_name: str, engine: str) -> None:
        values = (model_name, engine)
        for name, family in families.items():
            if name == "by_source":
                self.prompt_computed = family.labels(*values, "local_compute")
                self.prompt_cache_hit = family.labels(*values, "local_cache_hit")
                self.prompt_external = family.labels(*values, "external_kv_transfer")  # PD disaggregation
            elif name == "success":
                self.success = {reason: family.labels(*values, reason) for reason in FINISH_REASONS}
            elif name == "spec_per_pos":  # a child per proposal position, made when first counted
                self.spec_per_pos = {}
                self.spec_per_pos_child = lambda position, family=family: family.labels(*values, position)
            elif name == "counters":
                self.counters = {field: counter.labels(*values) for field, counter in family.items()}
            else:
                setattr(self, name, family.labels(*values))
        self.seen: dict[str, int] = {}  # counter snapshots (EngineStats fields, finish reasons)
        self.last_step_time: float | None = None

    def gauges(self) -> tuple:
        return self.num_running, self.num_waiting, self.kv_usage, self.kv_usage_old_name


class ServerMetrics:
    """The /metrics registry of one server; ``on_iteration`` is the AsyncLLMEngine hook.

    Engine series are per data-parallel replica (label ``engine``), so a sum over that label is the
    server's total; ``request_rejected_total`` happens before any replica and has no such label."""

    def __init__(self, model_name: str, prefix: str = "vllm", max_model_len: int = 2048,
                 cache_config: dict[str, str] | None = None, num_engines: int = 1,
                 weight_bytes: int | None = None, platform: dict[str, str] | None = None) -> None:
        if prefix not in METRICS_PREFIXES:
            raise ValueError(f"--metrics-prefix must be one of {', '.join(METRICS_PREFIXES)}; got {prefix!r}")
        disable_created_metrics()  # prometheus_client's switch is process-wide; every server wants it off
        self.registry = r = CollectorRegistry()
        self.prefix = prefix
        labels = ["model_name", "engine"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{prefix}:{name}", doc, labels, registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"{prefix}:{name}", doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(f"{prefix}:{name}", doc, labels, buckets=buckets, registry=r)

        families: dict = {}
        families["num_running"] = gauge("num_requests_running", "Number of requests in model execution batches.")
        families["num_waiting"] = gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        families["kv_usage"] = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        # vLLM's older name for the same value, which its example Grafana dashboard still reads
        families["kv_usage_old_name"] = gauge(
            "gpu_cache_usage_perc", "KV-cache usage (vLLM's older name of kv_cache_usage_perc). 1 means 100 "
                                    "percent usage.")
        families["counters"] = {field: counter(name, f"{name.replace('_', ' ').capitalize()} (engine total).")
                                for field, name in _COUNTERS.items()}
        families["prompt_tokens_cached"] = counter("prompt_tokens_cached",
                                                   "Prompt tokens served from the prefix cache.")
        families["prompt_tokens_recomputed"] = counter(
            "prompt_tokens_recomputed", "Cached prompt tokens computed again (none here: a prefix-cache hit "
                                        "never covers a prompt's last token).")
        families["by_source"] = Counter(f"{prefix}:prompt_tokens_by_source", "Prompt tokens by source.",
                                        labels + ["source"], registry=r)
        families["spec_per_pos"] = Counter(f"{prefix}:spec_decode_num_accepted_tokens_per_pos",
                                           "Accepted proposed tokens, by their position in the proposal.",
                                           labels + ["position"], registry=r)
        families["success"] = Counter(f"{prefix}:request_success", "Count of successfully processed requests.",
                                      labels + ["finished_reason"], registry=r)
        self._rejected = Counter(f"{prefix}:request_rejected",
                                 "Requests answered with an error status before reaching the engine.",
                                 ["model_name", "status"], registry=r)

        sizes = token_buckets(max_model_len)
        families["prompt_tokens_hist"] = histogram("request_prompt_tokens", "Number of prefill tokens processed.",
                                                   sizes)
        families["generation_tokens_hist"] = histogram("request_generation_tokens",
                                                       "Number of generation tokens processed.", sizes)
        families["max_generation_tokens_hist"] = histogram(
            "request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
            sizes)
        families["kv_computed_hist"] = histogram(
            "request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).", sizes)
        families["params_n"] = histogram("request_params_n", "Histogram of the n request parameter.", _N_BUCKETS)
        families["params_max_tokens"] = histogram("request_params_max_tokens",
                                                  "Histogram of the max_tokens request parameter.", sizes)
        families["iteration_tokens"] = histogram("iteration_tokens_total",
                                                 "Histogram of number of tokens per engine_step.", _ITERATION_BUCKETS)
        families["ttft"] = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                     _TTFT_BUCKETS)
        families["itl"] = histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                    _TOKEN_LATENCY_BUCKETS)
        families["tpot"] = histogram("time_per_output_token_seconds",
                                     "Histogram of time per output token in seconds. DEPRECATED: use "
                                     "inter_token_latency_seconds (kept for dashboards of vLLM < 0.11).",
                                     _TOKEN_LATENCY_BUCKETS)
        families["request_tpot"] = histogram("request_time_per_output_token_seconds",
                                             "Histogram of time_per_output_token_seconds per request.",
                                             _TOKEN_LATENCY_BUCKETS)
        latency = _REQUEST_LATENCY_BUCKETS
        families["e2e"] = histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                                    latency)
        families["queue_time"] = histogram("request_queue_time_seconds",
                                           "Histogram of time spent in WAITING phase for request.", latency)
        families["inference_time"] = histogram("request_inference_time_seconds",
                                               "Histogram of time spent in RUNNING phase for request.", latency)
        families["prefill_time"] = histogram("request_prefill_time_seconds",
                                             "Histogram of time spent in PREFILL phase for request.", latency)
        families["decode_time"] = histogram("request_decode_time_seconds",
                                            "Histogram of time spent in DECODE phase for request.", latency)
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1; got {num_engines}")
        self.engines = [EngineSeries(families, model_name, str(e)) for e in range(num_engines)]
        if cache_config is not None:  # the replicas share one config
            info_gauge = Gauge(f"{prefix}:cache_config_info", "Information of the LLMEngine CacheConfig",
                               [*cache_config, "engine"], registry=r)
            for e in range(num_engines):
                info_gauge.labels(**cache_config, engine=str(e)).set(1)
        if platform:  # the replicas run on one machine: the device, and a CPU's tier (a series vLLM has not)
            platform_gauge = Gauge("folovllm:platform_info", "The platform an engine runs on (device, CPU tier "
                                   "and kernels)", [*platform, "engine"], registry=r)
            for e in range(num_engines):
                platform_gauge.labels(**platform, engine=str(e)).set(1)
        if weight_bytes:  # the replicas load the same model
            weights = Gauge(f"{prefix}:model_weight_bytes", "Bytes of model weights an engine holds "
                            "(quantized weights as packed)", ["model_name", "engine"], registry=r)
            for e in range(num_engines):
                weights.labels(model_name, str(e)).set(weight_bytes)
        self._model_name = model_name
        self._last_token_time: dict[str, float] = {}  # request id -> when its latest token came
        # one series (no samples while LoRA is off) whose labels name the adapters waiting and running
        self._lora_info = Gauge(f"{prefix}:lora_requests_info", "Running stats on lora requests.",
                                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=r)
        self._lora_labels: tuple[str, str, str] | None = None

    def on_iteration(self, snap: EngineSnapshot, outputs: list[RequestOutput], ended: list[str]) -> None:
        """The AsyncLLMEngine hook: one engine iteration's snapshot, outputs and aborted request ids
        (``snap.engine`` says which replica's)."""
        series = self.engines[snap.engine]
        stats = snap.stats
        for field, counter in series.counters.items():
            self._inc(series, field, counter, getattr(stats, field))
        for reason, total in list(stats.finished_by_reason.items()):
            success = series.success.get(reason)
            if success is not None:
                self._inc(series, f"finished:{reason}", success, total)
        for position, total in enumerate(stats.spec_decode_num_accepted_tokens_per_pos):
            child = series.spec_per_pos.get(position) or series.spec_per_pos_child(str(position))
            series.spec_per_pos[position] = child
            self._inc(series, f"spec_pos:{position}", child, total)
        series.num_running.set(snap.num_running)
        series.num_waiting.set(snap.num_waiting)
        series.kv_usage.set(snap.kv_usage)
        series.kv_usage_old_name.set(snap.kv_usage)
        if snap.max_loras:
            self._observe_loras(snap)
        step = stats.last_step
        if step is not None and step.time != series.last_step_time:
            series.last_step_time = step.time
            series.iteration_tokens.observe(step.num_prefill_tokens + step.num_decode_tokens)
        now = time.perf_counter()
        for output in outputs:
            self._observe_request(series, output, now)
        for request_id in ended:  # aborted requests end without a finished output
            self._last_token_time.pop(request_id, None)

    def _observe_loras(self, snap: EngineSnapshot) -> None:
        """vLLM's ``lora_requests_info``: the adapters waiting and running (comma-separated labels), set to
        the time they last changed."""
        labels = (str(snap.max_loras), ",".join(snap.lora_waiting), ",".join(snap.lora_running))
        if labels != self._lora_labels:
            self._lora_info.clear()
            self._lora_info.labels(*labels).set_to_current_time()
            self._lora_labels = labels

    def observe_params(self, params: SamplingParams, num_prompts: int, engine: int = 0) -> None:
        """A request reached engine replica ``engine``: its ``n`` and ``max_tokens`` (when the client
        set one)."""
        series = self.engines[engine]
        for _ in range(num_prompts):
            series.params_n.observe(params.n)
            if params.max_tokens is not None:
                series.params_max_tokens.observe(params.max_tokens)

    def count_rejected(self, status: int) -> None:
        self._rejected.labels(self._model_name, str(status)).inc()

    def reset_gauges(self) -> None:
        """The engine is gone: nothing runs, waits or holds KV blocks any more."""
        for series in self.engines:
            for gauge in series.gauges():
                gauge.set(0)

    @staticmethod
    def _inc(series: EngineSeries, key: str, counter, total: float) -> None:
        delta = total - series.seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
        series.seen[key] = total

    def _observe_request(self, series: EngineSeries, output: RequestOutput, now: float) -> None:
        m = output.metrics
        latest = m.last_token_time or now
        previous = self._last_token_time.get(output.request_id)
        if previous is None:  # the request's first output: its prefill is done
            if m.first_token_time is not None:
                series.ttft.observe(m.first_token_time - m.arrival_time)
            cached, external = output.num_cached_tokens, output.num_external_computed_tokens
            series.prompt_tokens_cached.inc(cached)
            series.prompt_cache_hit.inc(cached)
            series.prompt_external.inc(external)
            series.prompt_computed.inc(len(output.prompt_token_ids) - cached - external)
        elif latest > previous:
            series.itl.observe(latest - previous)
            series.tpot.observe(latest - previous)
        if not output.finished:
            self._last_token_time[output.request_id] = latest
            return
        self._last_token_time.pop(output.request_id, None)
        series.e2e.observe(now - m.arrival_time)
        num_prompt = len(output.prompt_token_ids)
        lengths = [len(o.token_ids) for o in output.outputs]
        series.prompt_tokens_hist.observe(num_prompt)
        series.kv_computed_hist.observe(num_prompt - output.num_cached_tokens)
        series.generation_tokens_hist.observe(sum(lengths))
        series.max_generation_tokens_hist.observe(max(lengths, default=0))
        scheduled, first, last = m.first_scheduled_time, m.first_token_time, m.finished_time
        if scheduled is not None and m.queued_time is not None:
            series.queue_time.observe(max(scheduled - m.queued_time, 0.0))
        if scheduled is None or first is None or last is None:
            return  # ended before its first token (aborted, failed): no phase timings
        series.prefill_time.observe(first - scheduled)
        series.decode_time.observe(last - first)
        series.inference_time.observe(last - scheduled)
        if max(lengths) > 1:
            series.request_tpot.observe((last - first) / (max(lengths) - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RejectionCounter:
    """ASGI middleware: counts every error response (status >= 400) given to a request before it
    reached the engine (validation 400, 401, 404, 413, 503 busy or draining), by status."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or route_path(scope) in PROBE_PATHS:
            await self.app(scope, receive, send)
            return

        async def counting_send(message) -> None:
            if (message["type"] == "http.response.start" and message["status"] >= 400
                    and not scope.get(REACHED_ENGINE)):
                self.metrics.count_rejected(message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)
