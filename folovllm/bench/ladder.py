"""``folovllm bench throughput --compare all``: the technique ladder, measured on one workload.

Each rung adds one technique to the one before (every one is an engine switch):
M1 static batching + contiguous KV (max_model_len reserved per request) -> M2 continuous batching ->
M3 paged KV cache -> M5 chunked prefill -> M6 prefix caching. (M4, FlashAttention, is a GPU kernel:
on CPU every rung uses the same torch attention.)
"""
from __future__ import annotations

import gc
from typing import Any

import numpy as np

from folovllm.bench.results import write_results

RUNGS: list[tuple[str, dict[str, Any]]] = [
    ("M1 static + contiguous KV", dict(scheduling="static", kv_layout="contiguous",
                                       enable_chunked_prefill=False, enable_prefix_caching=False)),
    ("M2 + continuous batching", dict(scheduling="continuous", kv_layout="contiguous",
                                      enable_chunked_prefill=False, enable_prefix_caching=False)),
    ("M3 + paged KV cache", dict(scheduling="continuous", kv_layout="paged",
                                 enable_chunked_prefill=False, enable_prefix_caching=False)),
    ("M5 + chunked prefill", dict(scheduling="continuous", kv_layout="paged",
                                  enable_chunked_prefill=True, enable_prefix_caching=False)),
    ("M6 + prefix caching", dict(scheduling="continuous", kv_layout="paged",
                                 enable_chunked_prefill=True, enable_prefix_caching=True)),
]


def run_ladder(base_config: dict[str, Any], requests, measure_engine) -> list[dict[str, Any]]:
    from folovllm import LLM

    rows = []
    for label, switches in RUNGS:
        llm = LLM(**{**base_config, **switches})
        engine = llm.llm_engine
        timings, duration = measure_engine(llm, requests)
        kv = engine.kv_cache.stats()
        out_tokens = sum(t.num_output_tokens for t in timings)
        ttft = [t.ttft for t in timings]
        tpot = [t.tpot for t in timings if t.tpot is not None]
        rows.append({
            "name": label, "engine": "folovllm", "config": switches, "num_requests": len(timings),
            "duration_s": duration, "output_tok_s": out_tokens / duration,
            "total_tok_s": (out_tokens + sum(t.num_prompt_tokens for t in timings)) / duration,
            "ttft_ms_mean": 1000 * float(np.mean(ttft)), "tpot_ms_mean": 1000 * float(np.mean(tpot)),
            "kv_allocated_tokens": kv["peak_blocks_used"] * kv["block_size"],
            "kv_used_tokens": kv["peak_used_slots"],
            "max_concurrent_requests": engine.stats.peak_num_running})
        del llm, engine
        gc.collect()
    first = rows[0]["output_tok_s"]
    for row in rows:
        row["speedup"] = row["output_tok_s"] / first
    return rows


def format_ladder(rows: list[dict[str, Any]]) -> str:
    lines = ["| rung | TTFT mean ms | TPOT mean ms | output tok/s | KV allocated / used (tokens) | "
             "max concurrent | speed-up |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['ttft_ms_mean']:,.0f} | {r['tpot_ms_mean']:,.1f} | "
                     f"{r['output_tok_s']:,.1f} | {r['kv_allocated_tokens']:,} / {r['kv_used_tokens']:,} "
                     f"({r['kv_used_tokens'] / max(1, r['kv_allocated_tokens']):.0%}) | "
                     f"{r['max_concurrent_requests']} | {r['speedup']:.2f}× |")
    return "\n".join(lines)


def write_ladder(rows: list[dict[str, Any]], path: str | None) -> None:
    print(format_ladder(rows))
    if path:
        write_results(rows, path)
