"""A simulated run as ``bench serve``'s result object (same keys: ours and vLLM's), computed from the
recorder's arrays so that 100,000 requests cost no per-request Python objects."""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from folovllm.bench.serve_results import vllm_run_fields
from folovllm.simulator.recorder import Recorder


def _stats(values_s: np.ndarray) -> dict[str, float] | None:
    """``bench.results.latency_stats`` plus the max, over an array."""
    if values_s.size == 0:
        return None
    ms = values_s * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"mean": float(ms.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "max": float(ms.max())}


def _latencies(rec: Recorder, mask: np.ndarray, itl: np.ndarray) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT (requests of two tokens or more), E2EL and the ITL gaps, in seconds."""
    ttft = rec.first_token[mask] - rec.arrival[mask]
    e2el = rec.finished[mask] - rec.arrival[mask]
    outs = rec.output_len[mask]
    multi = outs >= 2
    tpot = (e2el[multi] - ttft[multi]) / (outs[multi] - 1)
    return {"ttft": ttft, "tpot": tpot, "itl": itl, "e2el": e2el}


def _summary(rec: Recorder, mask: np.ndarray, itl: np.ndarray, duration: float) -> dict[str, Any]:
    lat = _latencies(rec, mask, itl)
    n, ins, outs = int(mask.sum()), int(rec.prompt_len[mask].sum()), int(rec.output_len[mask].sum())
    return {"num_requests": n, "input_tokens": ins, "output_tokens": outs, "duration_s": duration,
            "request_throughput": n / duration, "input_tok_s": ins / duration, "output_tok_s": outs / duration,
            "total_tok_s": (ins + outs) / duration,
            **{f"{k}_ms": _stats(v) for k, v in lat.items()}}


def simulated_result(rec: Recorder, tags: list[str], *, name: str, model: str, config: dict[str, Any],
                     slos: dict[str, float] | None, metrics: list[str], percentiles: list[float],
                     rate: float | None, burstiness: float, extra: dict[str, Any],
                     per_request: bool = False) -> dict[str, Any]:
    """``bench serve``'s result object for a simulated run (``engine`` is ``folovllm-sim``).

    ``per_request``: also vLLM's per-request lists (ttfts, itls, input/output lens, errors)."""
    ok = rec.ok
    duration = max(float(np.nanmax(rec.finished) - rec.arrival.min()), 1e-9)
    itl = np.frombuffer(rec.itl, dtype=np.float64) if len(rec.itl) else np.zeros(0)
    result: dict[str, Any] = {"name": name, "engine": "folovllm-sim", "model": model, "dtype": "unknown",
                              "device": "simulated", "config": config}
    summary = _summary(rec, ok, itl, duration)
    result.update(summary)
    result.update(peak_memory_mb=None, kv_cache=None, extra=extra)
    result["failed_requests"] = int((~ok).sum())
    result["failures"] = dict(Counter(rec.errors.values()).most_common())
    lat = _latencies(rec, ok, itl)
    if slos:
        good = np.ones(int(ok.sum()), dtype=bool)
        outs = rec.output_len[ok]
        for key, limit_ms in slos.items():
            if key == "tpot":
                tpot = np.full(good.size, -np.inf)
                tpot[outs >= 2] = lat["tpot"]
                good &= tpot * 1000.0 <= limit_ms
            else:
                good &= lat[key] * 1000.0 <= limit_ms
        result["goodput"] = {"slos_ms": slos, "good_requests": int(good.sum()),
                             "request_goodput": int(good.sum()) / duration}
    classes = sorted({t for t in tags if t})
    if classes:
        tag_array = np.asarray(tags)
        result["classes"] = {}
        for tag in classes:
            part = _summary(rec, ok & (tag_array == tag), np.zeros(0), duration)
            part.pop("itl_ms")
            part["itl_ms"] = None  # pooled gaps are not kept per class
            result["classes"][tag] = {k: part[k] for k in ("num_requests", "input_tokens", "output_tokens",
                                                           "output_tok_s", "ttft_ms", "tpot_ms", "itl_ms",
                                                           "e2el_ms")}
            result["classes"][tag]["failed_requests"] = int(((~ok) & (tag_array == tag)).sum())
    result.update(vllm_run_fields(backend=None, label="folovllm-sim", model=model, tokenizer=None,
                                  num_prompts=len(rec.arrival), rate=rate, burstiness=burstiness,
                                  max_concurrency=None))
    result.update({"duration": duration, "completed": summary["num_requests"], "failed": result["failed_requests"],
                   "total_input_tokens": summary["input_tokens"], "total_output_tokens": summary["output_tokens"],
                   "request_throughput": summary["request_throughput"], "output_throughput": summary["output_tok_s"],
                   "total_token_throughput": summary["total_tok_s"]})
    if "goodput" in result:
        result["request_goodput"] = result["goodput"]["request_goodput"]
    for metric in metrics:
        values = lat[metric] * 1000.0 if lat[metric].size else np.zeros(1)
        result[f"mean_{metric}_ms"] = float(values.mean())
        result[f"median_{metric}_ms"] = float(np.median(values))
        result[f"std_{metric}_ms"] = float(values.std())
        for p in percentiles:
            label = str(int(p)) if p == int(p) else str(p)
            result[f"p{label}_{metric}_ms"] = float(np.percentile(values, p))
    if per_request:
        result.update(_per_request_lists(rec, ok))
    return result


def _per_request_lists(rec: Recorder, ok: np.ndarray) -> dict[str, Any]:
    """vLLM's per-request keys (seconds); ``itls`` needs the recorder's token times."""
    times = rec.token_times or [[] for _ in rec.arrival]
    return {"input_lens": rec.prompt_len.tolist(), "output_lens": rec.output_len.tolist(),
            "ttfts": [float(f - a) if good else 0.0 for f, a, good in zip(rec.first_token, rec.arrival, ok)],
            "itls": [[b - a for a, b in zip(t, t[1:])] for t in times],
            "errors": [rec.errors.get(i, "") for i in range(len(rec.arrival))]}
