"""vLLM's documented /metrics series (docs "Production Metrics" and its design notes), by family name
without the ``vllm:`` prefix, checked against what `folovllm serve` exports.

Counters are named here as the Prometheus parser names their family (without ``_total``), as vLLM's
docs list them; ``iteration_tokens_total`` is a histogram whose name ends in ``_total``.
"""
from __future__ import annotations

# Series we export, with vLLM's type; each carries model_name and engine labels.
EMITTED: dict[str, str] = {
    "num_requests_running": "gauge",
    "num_requests_waiting": "gauge",
    "kv_cache_usage_perc": "gauge",
    "external_prefix_cache_queries": "counter",  # PD disaggregation: prompt tokens asked of a producer
    "external_prefix_cache_hits": "counter",
    "gpu_cache_usage_perc": "gauge",  # kv_cache_usage_perc's older name: vLLM's example dashboard reads it
    "cache_config_info": "gauge",
    "prefix_cache_queries": "counter",
    "prefix_cache_hits": "counter",
    "num_preemptions": "counter",
    "prompt_tokens": "counter",
    "prompt_tokens_by_source": "counter",
    "prompt_tokens_cached": "counter",
    "prompt_tokens_recomputed": "counter",
    "generation_tokens": "counter",
    "request_success": "counter",
    "request_prompt_tokens": "histogram",
    "request_generation_tokens": "histogram",
    "iteration_tokens_total": "histogram",
    "request_max_num_generation_tokens": "histogram",
    "request_params_n": "histogram",
    "request_params_max_tokens": "histogram",
    "request_prefill_kv_computed_tokens": "histogram",
    "time_to_first_token_seconds": "histogram",
    "inter_token_latency_seconds": "histogram",
    "time_per_output_token_seconds": "histogram",  # deprecated in vLLM 0.11; older dashboards read it
    "request_time_per_output_token_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram",
    "request_queue_time_seconds": "histogram",
    "request_inference_time_seconds": "histogram",
    "request_prefill_time_seconds": "histogram",
    "request_decode_time_seconds": "histogram",
    "spec_decode_num_drafts": "counter",  # zero unless --speculative-config
    "spec_decode_num_draft_tokens": "counter",
    "spec_decode_num_accepted_tokens": "counter",
    "spec_decode_num_accepted_tokens_per_pos": "counter",  # samples (by position) with --speculative-config
    "lora_requests_info": "gauge",  # vLLM's labels (max_lora, waiting/running adapters); samples with --enable-lora
}

# Documented by vLLM, not exported here, and why.
NOT_EMITTED: dict[str, str] = {
    "engine_sleep_state": "no sleep mode (the engine never offloads its weights)",
    "corrupted_requests": "logits are not scanned for NaNs (vLLM too exports it only when asked to)",
    "mm_cache_queries": "text-only models: no multi-modal cache",
    "mm_cache_hits": "text-only models",
    "kv_block_lifetime_seconds": "KV block residency sampling is not implemented (opt-in in vLLM)",
    "kv_block_idle_before_evict_seconds": "KV block residency sampling is not implemented",
    "kv_block_reuse_gap_seconds": "KV block residency sampling is not implemented",
    "gpu_prefix_cache_queries": "renamed prefix_cache_queries in vLLM 0.9 and since removed",
    "gpu_prefix_cache_hits": "renamed prefix_cache_hits in vLLM 0.9 and since removed",
    "num_requests_swapped": "vLLM's V0 CPU swapping; preemption here recomputes",
    "cpu_cache_usage_perc": "vLLM's V0 CPU swapping",
}

# Ours alone (kept under the chosen prefix): error responses given before reaching the engine.
OWN: dict[str, str] = {"request_rejected": "counter", "kv_transfer_loads": "counter",
                       "kv_transfer_load_failures": "counter", "kv_transfer_sends": "counter",
                       "kv_transfer_recv_bytes": "counter", "kv_transfer_recv_seconds": "counter",
                       "model_weight_bytes": "gauge"}

# Every series the queries of vLLM's example Grafana dashboards name (vllm-project/vllm,
# examples/online_serving/prometheus_grafana/grafana.json at 004f771f and
# k8s-monitoring/grafana-dashboard.json at cf6f12c2), as sample names. Left out: the k8s dashboard's
# bare `vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`, counter families whose samples
# prometheus_client (vLLM's exporter as ours) names `..._total`; and the dashboards under
# examples/online_serving/dashboards/, whose queries read `vllm_*` names that vLLM does not export.
GRAFANA_SERIES: frozenset[str] = frozenset({
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_sum", "vllm:generation_tokens_total", "vllm:gpu_cache_usage_perc",
    "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:prompt_tokens_total", "vllm:request_decode_time_seconds_sum", "vllm:request_decode_time_seconds_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_max_num_generation_tokens_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_prompt_tokens_bucket", "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_bucket", "vllm:request_success_total",
    "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_count",
    "vllm:time_per_output_token_seconds_sum", "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_sum",
    "vllm:inter_token_latency_seconds_bucket", "vllm:inter_token_latency_seconds_count",
    "vllm:inter_token_latency_seconds_sum", "vllm:iteration_tokens_total_bucket",
    "vllm:num_preemptions_total",
})
