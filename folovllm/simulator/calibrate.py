"""Fits a linear cost model to an engine's step trace (``--trace`` JSONL) by non-negative least squares, and says
how well it fits: R², median and p90 relative error of the predicted step time, and the summed error per
prefill-size bucket."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from folovllm.simulator.cost_model import LINEAR_TERMS, LinearCostModel, StepShape

NEEDED = ("num_prefill_tokens", "num_decode_tokens", "num_scheduled", "context_tokens", "duration_s")
# prefill tokens per step: the buckets the fit reports its error in
PREFILL_BUCKETS = (0, 1, 32, 128, 512, 1024, 1536)
# where the below-knee prefill term may stop counting; the fit keeps the one with the smallest error. Up to
# 1,024: a knee near the largest step the trace has (the step budget) would let the few full steps set
# the cost of every token past it, which then extrapolates to larger budgets at almost nothing a token
KNEE_CANDIDATES = (64, 128, 256, 512, 768, 1024)


def shape_of(record: dict[str, Any]) -> StepShape:
    """A traced step's shape. Fields a trace written before they were recorded lacks read as 0 (their
    terms stay unfitted)."""
    return StepShape(int(record["num_prefill_tokens"]), int(record["num_decode_tokens"]),
                     int(record["context_tokens"]), int(record["num_scheduled"]),
                     prefill_cached_pairs=int(record.get("prefill_cached_pairs", 0)),
                     prefill_new_pairs=int(record.get("prefill_new_pairs", 0)))


def read_trace_shapes(path: str | Path) -> tuple[list[StepShape], np.ndarray]:
    """Each traced step's shape and duration (s). ValueError for a trace without the cost fields
    (written before they were recorded: trace again with this version)."""
    shapes, durations = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            missing = [k for k in NEEDED if k not in record]
            if missing:
                raise ValueError(f"{path}:{lineno}: the step lacks {', '.join(missing)}; this trace predates "
                                 "the cost fields, record it again with --trace")
            if record["num_scheduled"] == 0:
                continue
            shapes.append(shape_of(record))
            durations.append(float(record["duration_s"]))
    if len(shapes) < len(LINEAR_TERMS):
        raise ValueError(f"{path}: {len(shapes)} steps; a fit needs at least {len(LINEAR_TERMS)}")
    return shapes, np.asarray(durations)


def busy_gap_s(path: str | Path) -> float:
    """Median time from the end of one step to the start of the next while requests are running: the
    engine loop's own work outside a step (handing outputs over, taking new requests), which the
    simulator adds to every step. 0 for a trace without such pairs."""
    gaps, previous = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("num_scheduled", 0) == 0:
                continue
            if previous is not None and previous["num_running"] > 0:
                gaps.append(record["time"] - record["duration_s"] - previous["time"])
            previous = record
    return max(0.0, float(np.median(gaps))) if gaps else 0.0


def fit_errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """R², median and p90 of |predicted - measured| / measured."""
    residual = measured - predicted
    total = float(((measured - measured.mean()) ** 2).sum())
    relative = np.abs(residual) / np.maximum(measured, 1e-12)
    return {"r2": 1.0 - float((residual ** 2).sum()) / total if total > 0 else 1.0,
            "median_rel_error": float(np.median(relative)), "p90_rel_error": float(np.percentile(relative, 90))}


WEIGHTINGS = ("relative", "sqrt", "absolute")


def nonnegative_lstsq(features: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Least squares with every weight >= 0 (Lawson and Hanson's active-set method). A step cannot get
    cheaper by having more of something, and terms that move together (decode rows and batch size in
    decode-only steps) otherwise trade large opposite weights that extrapolate badly (a prefill step
    predicted at less than nothing)."""
    norms = np.linalg.norm(features, axis=0)
    norms[norms == 0] = 1.0
    scaled = features / norms  # columns span ~9 orders of magnitude: solve on unit columns
    num_terms = scaled.shape[1]
    free = np.zeros(num_terms, dtype=bool)  # the terms allowed a positive weight
    weights = np.zeros(num_terms)
    tolerance = 1e-10 * max(1.0, float(np.abs(scaled.T @ targets).max()))
    for _ in range(3 * num_terms):
        gradient = scaled.T @ (targets - scaled @ weights)
        if free.all() or gradient[~free].max() <= tolerance:
            break
        free[np.argmax(np.where(free, -np.inf, gradient))] = True
        while True:  # solve on the free terms; step back to the boundary while any comes out <= 0
            trial = np.zeros(num_terms)
            trial[free], *_ = np.linalg.lstsq(scaled[:, free], targets, rcond=None)
            if (trial[free] > 0).all():
                weights = trial
                break
            shrinking = free & (trial <= 0)
            alpha = np.min(weights[shrinking] / np.maximum(weights[shrinking] - trial[shrinking], 1e-300))
            weights = weights + alpha * (trial - weights)
            free &= weights > 1e-15
            weights[~free] = 0.0
    return weights / norms


def _weighted_fit(shapes: list[StepShape], durations: np.ndarray, scale: np.ndarray,
                  knee: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Non-negative weights over ``LINEAR_TERMS`` for one knee, which terms the trace varies, and the
    weighted squared error the fit leaves."""
    features = np.asarray([s.features(knee) for s in shapes])
    varies = np.ones(features.shape[1], dtype=bool)
    varies[1:] = features[:, 1:].std(axis=0) > 0
    weights = np.zeros(features.shape[1])
    weights[varies] = nonnegative_lstsq(features[:, varies] * scale[:, None], durations * scale)
    residual = (features @ weights - durations) * scale
    return weights, varies, float(residual @ residual)


def pick_knee(shapes: list[StepShape], durations: np.ndarray, scale: np.ndarray) -> int:
    """The candidate knee whose fit leaves the smallest weighted error; 0 (no bend) when no candidate
    lies below the trace's largest prefill step or none fits better than a straight line."""
    largest = max(s.num_prefill_tokens for s in shapes)
    best_knee, best_error = 0, _weighted_fit(shapes, durations, scale, 0)[2]
    for knee in (k for k in KNEE_CANDIDATES if k < largest):
        error = _weighted_fit(shapes, durations, scale, knee)[2]
        if error < best_error * (1 - 1e-9):
            best_knee, best_error = knee, error
    return best_knee


def bucket_errors(predicted: np.ndarray, measured: np.ndarray, shapes: list[StepShape]) -> list[dict[str, Any]]:
    """Per prefill-size bucket: steps, summed measured and predicted seconds, and their relative gap."""
    prefill = np.asarray([s.num_prefill_tokens for s in shapes])
    rows = []
    for low, high in zip(PREFILL_BUCKETS, (*PREFILL_BUCKETS[1:], None)):
        inside = (prefill >= low) & (prefill < high if high is not None else True)
        if inside.any():
            real, guess = float(measured[inside].sum()), float(predicted[inside].sum())
            rows.append({"prefill_tokens": [low, high], "steps": int(inside.sum()), "measured_s": real,
                         "predicted_s": guess, "rel_error": guess / real - 1 if real else None})
    return rows


def fit_linear(shapes: list[StepShape], durations: np.ndarray, name: str,
               defaults: dict[str, Any] | None = None, source: str = "",
               weighting: str = "absolute", between_steps_s: float = 0.0,
               knee: int | str = "auto") -> LinearCostModel:
    """Non-negative least squares over ``LINEAR_TERMS``; a term the trace never varies (e.g. no prefill)
    gets 0. ``relative`` weighting minimises each step's relative error, so that the many short decode
    steps (which set TPOT) count as much as the few long prefill steps; ``absolute`` minimises seconds,
    so the long steps (which set TTFT under load and the total time) dominate; ``sqrt`` weighs each
    squared error by 1 / duration, between the two. ``knee``: where the below-knee prefill term stops
    counting (``auto``: the candidate that fits best; 0: a straight line in prefill tokens).
    ``between_steps_s`` (the engine loop's time outside a step) is added to the fixed term after the fit,
    which is of the steps' own durations."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, not {weighting!r}")
    floor = np.maximum(durations, 1e-9)
    scale = {"relative": 1.0 / floor, "sqrt": 1.0 / np.sqrt(floor), "absolute": np.ones_like(durations)}[weighting]
    if knee == "auto":
        knee = pick_knee(shapes, durations, scale)
    if not isinstance(knee, int) or knee < 0:
        raise ValueError(f"knee must be 'auto' or a number of tokens >= 0, not {knee!r}")
    weights, varies, _ = _weighted_fit(shapes, durations, scale, knee)
    model = LinearCostModel(name, dict(zip(LINEAR_TERMS, map(float, weights))), defaults=defaults or {},
                            prefill_knee_tokens=knee)
    predicted = np.asarray([model.step_time(s) for s in shapes])
    weights[0] += between_steps_s
    model = LinearCostModel(name, dict(zip(LINEAR_TERMS, map(float, weights))), defaults=defaults or {},
                            prefill_knee_tokens=knee)
    unused = {"per_prefill_token_below_knee_s"} if knee == 0 else set()
    model.fit = {"source": source, "num_steps": len(shapes), "weighting": weighting,
                 "between_steps_s": between_steps_s, **fit_errors(predicted, durations),
                 "by_prefill_tokens": bucket_errors(predicted, durations, shapes),
                 "unfitted_terms": [t for t, v in zip(LINEAR_TERMS, varies) if not v and t not in unused],
                 "zeroed_terms": [t for t, v, w in zip(LINEAR_TERMS, varies, weights) if v and w == 0.0]}
    return model


def price_steps(model: LinearCostModel, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Traced steps (trace records) priced by ``model`` against their traced durations: the fit's error
    figures and the summed error per prefill-size bucket. The engine loop's time between steps, which
    the profile adds to every step, is taken off, since a traced duration is the step's own."""
    records = [r for r in records if r.get("num_scheduled")]
    shapes = [shape_of(r) for r in records]
    measured = np.asarray([float(r["duration_s"]) for r in records])
    gap = model.fit.get("between_steps_s", 0.0)
    predicted = np.asarray([model.step_time(s) for s in shapes]) - gap
    return {"steps": len(shapes), "measured_s": float(measured.sum()), "predicted_s": float(predicted.sum()),
            **fit_errors(predicted, measured), "by_prefill_tokens": bucket_errors(predicted, measured, shapes)}


def format_buckets(rows: list[dict[str, Any]]) -> str:
    """``prefill tokens: summed error (steps)`` per bucket, on one line."""
    def label(low: int, high: int | None) -> str:
        return "decode-only" if high == 1 else f"{low}+" if high is None else f"{low}-{high - 1}"
    return "; ".join(f"{label(*row['prefill_tokens'])} {row['rel_error']:+.0%} ({row['steps']})" for row in rows)


def calibrate(trace: str | Path, out: str | Path, name: str, defaults: dict[str, Any] | None = None,
              weighting: str = "absolute", api_server_s: float = 0.0, knee: int | str = "auto",
              api_server_burst_s: float = 0.0, speed_probe: dict[str, float] | None = None) -> LinearCostModel:
    """Fits ``trace``, writes the profile to ``out`` and returns it. ``api_server_s`` and
    ``api_server_burst_s`` (measured outside the trace) are kept in the profile for the simulator's API
    server, ``speed_probe`` (``speed.py``) for comparing live runs at the calibration's machine speed."""
    shapes, durations = read_trace_shapes(trace)
    model = fit_linear(shapes, durations, name, defaults, source=str(trace), weighting=weighting,
                       between_steps_s=busy_gap_s(trace), knee=knee)
    model.api_server_s, model.api_server_burst_s = api_server_s, api_server_burst_s
    model.speed_probe = dict(speed_probe or {})
    model.save(out)
    return model


def format_fit(model: LinearCostModel) -> str:
    fit = model.fit
    lines = [f"profile {model.name}: {fit['num_steps']} steps",
             *(f"  {term:<28}{value * 1e3:>12.5g} ms" for term, value in model.coefficients.items()),
             f"  R² {fit['r2']:.3f}; relative error median {fit['median_rel_error']:.1%}, "
             f"p90 {fit['p90_rel_error']:.1%}"]
    if model.prefill_knee_tokens:
        lines.append(f"  the below-knee prefill term counts a step's first {model.prefill_knee_tokens} prefill tokens")
    if fit.get("by_prefill_tokens"):
        lines.append(f"  summed error by prefill tokens per step: {format_buckets(fit['by_prefill_tokens'])}")
    if fit["unfitted_terms"]:
        lines.append(f"  not in the trace (set to 0): {', '.join(fit['unfitted_terms'])}")
    if fit.get("between_steps_s"):
        lines.append(f"  fixed_s includes {fit['between_steps_s'] * 1e3:.2f} ms between busy steps (the engine loop)")
    if model.api_server_s:
        lines.append(f"  API server {model.api_server_s * 1e3:.2f} ms per request (before the engine has it)")
    if model.api_server_burst_s:
        lines.append(f"  and {model.api_server_burst_s * 1e3:.2f} ms more per request of a burst after the first "
                     "(sent at one instant)")
    if model.speed_probe:
        lines.append(f"  machine-speed probe: one-row decode step {model.speed_probe['decode_step_s'] * 1e3:.2f} ms, "
                     f"prefill step {model.speed_probe['prefill_step_s'] * 1e3:.1f} ms")
    if fit.get("zeroed_terms"):
        lines.append(f"  would fit negative (held at 0): {', '.join(fit['zeroed_terms'])}")
    return "\n".join(lines)
