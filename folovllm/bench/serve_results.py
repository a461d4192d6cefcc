"""``bench serve`` results: latency and throughput metrics from request outcomes, goodput, classes, console report."""
from __future__ import annotations

import datetime
import math
import re
from collections import Counter
from typing import Any

import numpy as np

from folovllm.bench.results import LATENCY_KEYS, RequestTiming, build_result, format_result
from folovllm.bench.serve_client import RequestOutcome

SLO_KEYS = ("ttft", "tpot", "e2el")


def parse_goodput(specs: list[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` (or ``"ttft:200,tpot:50"``) → {"ttft": 200.0, "tpot": 50.0} in ms."""
    slos: dict[str, float] = {}
    for item in (part for spec in specs or [] for part in re.split(r"[,\s]+", spec) if part):
        key, sep, value = item.partition(":")
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"--goodput takes KEY:MS with KEY one of {', '.join(SLO_KEYS)}; got {item!r}.")
        try:
            slos[key] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {key}: {value!r} is not a number of milliseconds.") from None
        if slos[key] <= 0:
            raise ValueError(f"--goodput {key} must be positive, got {value}.")
    return slos


def meets_slos(timing: RequestTiming, slos: dict[str, float]) -> bool:
    """Every SLO given holds. An undefined TPOT (one output token) cannot miss; a missing TTFT does."""
    observed = {"ttft": timing.ttft, "tpot": timing.tpot, "e2el": timing.e2el}
    for key, limit_ms in slos.items():
        value = observed[key]
        if value is None:
            if key == "tpot":
                continue
            return False
        if value * 1000.0 > limit_ms:
            return False
    return True


def latency_samples_ms(timings: list[RequestTiming]) -> dict[str, list[float]]:
    """Per-request TTFT / TPOT / E2EL and pooled ITL gaps in ms (the distributions behind the stats)."""
    return {
        "ttft_ms": [t.ttft * 1000 for t in timings if t.ttft is not None],
        "tpot_ms": [t.tpot * 1000 for t in timings if t.tpot is not None],
        "itl_ms": [(b - a) * 1000 for t in timings for a, b in zip(t.token_times, t.token_times[1:])],
        "e2el_ms": [t.e2el * 1000 for t in timings],
    }


def _add_max(result: dict[str, Any], timings: list[RequestTiming]) -> None:
    for key, values in latency_samples_ms(timings).items():
        if result[key] is not None:
            result[key]["max"] = max(values)


def window_s(outcomes: list[RequestOutcome]) -> float:
    """First send → last finish, over every request (failed ones included)."""
    return max(o.end_time for o in outcomes) - min(o.send_time for o in outcomes)


def build_serve_result(outcomes: list[RequestOutcome], *, name: str, engine: str, model: str,
                       config: dict[str, Any], slos: dict[str, float] | None = None) -> dict[str, Any]:
    """The result object (as ``build_result``) over the successful requests, plus ``failed_requests``, ``failures``
    (reason → count), ``goodput`` (when SLOs are given) and ``classes`` (per tag, when tagged)."""
    if not outcomes:
        raise ValueError("no requests were sent.")
    duration = max(window_s(outcomes), 1e-9)
    ok = [o for o in outcomes if o.success]
    timings = [o.timing() for o in ok]
    result = build_result(name=name, engine=engine, model=model, dtype="unknown", device="remote",
                          config=config, timings=timings, duration_s=duration, peak_memory_mb=None)
    _add_max(result, timings)
    result["failed_requests"] = len(outcomes) - len(ok)
    result["failures"] = dict(Counter(o.error for o in outcomes if not o.success).most_common())
    if slos:
        good = sum(meets_slos(t, slos) for t in timings)
        result["goodput"] = {"slos_ms": slos, "good_requests": good, "request_goodput": good / duration}
    tags = sorted({o.request.tag for o in outcomes if o.request.tag})
    if tags:
        result["classes"] = {}
        for tag in tags:
            sub = [t for o, t in zip(ok, timings) if o.request.tag == tag]
            part = build_result(name=name, engine=engine, model=model, dtype="unknown", device="remote",
                                config={}, timings=sub, duration_s=duration, peak_memory_mb=None)
            _add_max(part, sub)
            result["classes"][tag] = {k: part[k] for k in ("num_requests", "input_tokens", "output_tokens",
                                                           "output_tok_s", *LATENCY_KEYS)}
            result["classes"][tag]["failed_requests"] = sum(
                not o.success for o in outcomes if o.request.tag == tag)
    return result


def _ms(stats: dict[str, float] | None, key: str) -> str:
    return "n/a" if stats is None else f"{stats[key]:,.1f}"


def format_serve_result(result: dict[str, Any]) -> str:
    """results.format_result's report, plus failures, goodput and the per-class lines."""
    lines = format_result(result).splitlines()
    closing = lines.pop()
    extra = [f"{'Failed requests:':<40}{result['failed_requests']}"]
    extra += [f"  {count} × {reason}" for reason, count in list(result["failures"].items())[:5]]
    for key in LATENCY_KEYS:
        if result[key] is not None:
            extra.append(f"{'Max ' + key[:-3].upper() + ' (ms):':<40}{result[key]['max']:,.1f}")
    if "goodput" in result:
        slos = ", ".join(f"{k} ≤ {v:g} ms" for k, v in result["goodput"]["slos_ms"].items())
        extra.append(f"{'Request goodput (req/s):':<40}{result['goodput']['request_goodput']:,.2f} ({slos})")
    for tag, part in result.get("classes", {}).items():
        extra.append(f"class {tag}: {part['num_requests']} ok / {part['failed_requests']} failed, "
                     f"{part['output_tok_s']:,.1f} out tok/s; p50 TTFT {_ms(part['ttft_ms'], 'p50')} ms, "
                     f"TPOT {_ms(part['tpot_ms'], 'p50')} ms, E2EL {_ms(part['e2el_ms'], 'p50')} ms")
    return "\n".join(lines + extra + [closing])


VLLM_PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


def parse_percentile_metrics(text: str) -> list[str]:
    """``"ttft,tpot,itl"`` → the metrics ``vllm bench serve`` reports percentiles of."""
    metrics = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in metrics if m not in VLLM_PERCENTILE_METRICS]
    if bad or not metrics:
        raise ValueError(f"--percentile-metrics takes a comma-separated subset of "
                         f"{','.join(VLLM_PERCENTILE_METRICS)}; got {text!r}.")
    return metrics


def parse_metric_percentiles(text: str) -> list[float]:
    """``"50,90,99"`` → [50.0, 90.0, 99.0], each in (0, 100]."""
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--metric-percentiles takes comma-separated numbers; got {text!r}.") from None
    if not values or any(not 0 < p <= 100 for p in values):
        raise ValueError(f"--metric-percentiles must be in (0, 100]; got {text!r}.")
    return values


def vllm_run_fields(*, backend: str | None, label: str | None, model: str, tokenizer: str | None,
                    num_prompts: int, rate: float | None, burstiness: float,
                    max_concurrency: int | None) -> dict[str, Any]:
    """The keys of ``vllm bench serve``'s result that describe the run (``rate`` None: a replayed trace)."""
    return {"date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": backend or "openai",
            "backend": backend or "openai", "label": label, "model_id": model, "tokenizer_id": tokenizer or model,
            "num_prompts": num_prompts, "request_rate": "inf" if rate is None or math.isinf(rate) else rate,
            "burstiness": burstiness, "max_concurrency": max_concurrency}


def vllm_result_fields(outcomes: list[RequestOutcome], result: dict[str, Any], metrics: list[str],
                       percentiles: list[float]) -> dict[str, Any]:
    """The keys ``vllm bench serve --save-result`` writes, from the same outcomes as ``result``:
    counts, throughputs, per-request lists (seconds) and, per selected metric, mean / median / std
    / p<P> in ms (``p99_ttft_ms``; a whole percentile without its decimals, as vLLM names it)."""
    ok = [o for o in outcomes if o.success]
    samples = latency_samples_ms([o.timing() for o in ok])
    duration = result["duration_s"]
    fields: dict[str, Any] = {
        "duration": duration, "completed": len(ok), "failed": len(outcomes) - len(ok),
        "total_input_tokens": result["input_tokens"], "total_output_tokens": result["output_tokens"],
        "request_throughput": result["request_throughput"], "output_throughput": result["output_tok_s"],
        "total_token_throughput": result["total_tok_s"],
        "input_lens": [o.prompt_tokens for o in outcomes],
        "output_lens": [o.output_tokens for o in outcomes],
        "ttfts": [o.chunk_times[0] - o.send_time if o.success and o.chunk_times else 0.0 for o in outcomes],
        "itls": [[b - a for a, b in zip(o.chunk_times, o.chunk_times[1:])] for o in outcomes],
        "errors": [o.error or "" for o in outcomes],
    }
    if "goodput" in result:
        fields["request_goodput"] = result["goodput"]["request_goodput"]
    for metric in metrics:
        values = np.asarray(samples[f"{metric}_ms"] or [0.0], dtype=np.float64)
        fields[f"mean_{metric}_ms"] = float(values.mean())
        fields[f"median_{metric}_ms"] = float(np.median(values))
        fields[f"std_{metric}_ms"] = float(values.std())
        for p in percentiles:
            name = str(int(p)) if p == int(p) else str(p)
            fields[f"p{name}_{metric}_ms"] = float(np.percentile(values, p))
    return fields
