"""Fits a linear cost model to an engine's step trace (``--trace`` JSONL) by non-negative least squares, and says
how well it fits: R², median and p90 relative error of the predicted step time."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from folovllm.simulator.cost_model import LINEAR_TERMS, LinearCostModel, StepShape

NEEDED = ("num_prefill_tokens", "num_decode_tokens", "num_scheduled", "context_tokens", "duration_s")


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
            # traces written before prefill_cached_pairs was recorded read as 0 (that term stays unfitted)
            shapes.append(StepShape(int(record["num_prefill_tokens"]), int(record["num_decode_tokens"]),
                                    int(record["context_tokens"]), int(record["num_scheduled"]),
                                    prefill_cached_pairs=int(record.get("prefill_cached_pairs", 0))))
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
    """Least squares with every weight >= 0: refits without the terms that come out negative until none
    does. A step cannot get cheaper by having more of something, and terms that move together (decode
    rows and batch size in decode-only steps) otherwise trade large opposite weights that extrapolate
    badly (a prefill step predicted at less than nothing)."""
    norms = np.linalg.norm(features, axis=0)
    norms[norms == 0] = 1.0
    scaled = features / norms  # columns span ~9 orders of magnitude: solve on unit columns
    active = np.ones(features.shape[1], dtype=bool)
    weights = np.zeros(features.shape[1])
    while active.any():
        weights[:] = 0.0
        weights[active], *_ = np.linalg.lstsq(scaled[:, active], targets, rcond=None)
        weights[active] /= norms[active]
        negative = active & (weights < 0)
        if not negative.any():
            break
        active[np.argmin(np.where(negative, weights, np.inf))] = False
    return weights


def fit_linear(shapes: list[StepShape], durations: np.ndarray, name: str,
               defaults: dict[str, Any] | None = None, source: str = "",
               weighting: str = "absolute", between_steps_s: float = 0.0) -> LinearCostModel:
    """Non-negative least squares over ``LINEAR_TERMS``; a term the trace never varies (e.g. no prefill)
    gets 0. ``relative`` weighting minimises each step's relative error, so that the many short decode
    steps (which set TPOT) count as much as the few long prefill steps; ``absolute`` minimises seconds,
    so the long steps (which set TTFT under load and the total time) dominate; ``sqrt`` weighs each
    squared error by 1 / duration, between the two. ``between_steps_s`` (the engine loop's time outside
    a step) is added to the fixed term after the fit, which is of the steps' own durations."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, not {weighting!r}")
    features = np.asarray([s.features() for s in shapes])
    varies = np.ones(features.shape[1], dtype=bool)
    varies[1:] = features[:, 1:].std(axis=0) > 0
    floor = np.maximum(durations, 1e-9)
    scale = {"relative": 1.0 / floor, "sqrt": 1.0 / np.sqrt(floor), "absolute": np.ones_like(durations)}[weighting]
    weights = np.zeros(features.shape[1])
    weights[varies] = nonnegative_lstsq(features[:, varies] * scale[:, None], durations * scale)
    model = LinearCostModel(name, dict(zip(LINEAR_TERMS, map(float, weights))), defaults=defaults or {})
    predicted = np.asarray([model.step_time(s) for s in shapes])
    weights[0] += between_steps_s
    model = LinearCostModel(name, dict(zip(LINEAR_TERMS, map(float, weights))), defaults=defaults or {})
    model.fit = {"source": source, "num_steps": len(shapes), "weighting": weighting,
                 "between_steps_s": between_steps_s, **fit_errors(predicted, durations),
                 "unfitted_terms": [t for t, v in zip(LINEAR_TERMS, varies) if not v],
                 "zeroed_terms": [t for t, v, w in zip(LINEAR_TERMS, varies, weights) if v and w == 0.0]}
    return model


def calibrate(trace: str | Path, out: str | Path, name: str, defaults: dict[str, Any] | None = None,
              weighting: str = "absolute", api_server_s: float = 0.0) -> LinearCostModel:
    """Fits ``trace``, writes the profile to ``out`` and returns it. ``api_server_s`` (measured outside
    the trace) is kept in the profile for the simulator's API server."""
    shapes, durations = read_trace_shapes(trace)
    model = fit_linear(shapes, durations, name, defaults, source=str(trace), weighting=weighting,
                       between_steps_s=busy_gap_s(trace))
    model.api_server_s = api_server_s
    model.save(out)
    return model


def format_fit(model: LinearCostModel) -> str:
    fit = model.fit
    lines = [f"profile {model.name}: {fit['num_steps']} steps",
             *(f"  {term:<28}{value * 1e3:>12.5g} ms" for term, value in model.coefficients.items()),
             f"  R² {fit['r2']:.3f}; relative error median {fit['median_rel_error']:.1%}, "
             f"p90 {fit['p90_rel_error']:.1%}"]
    if fit["unfitted_terms"]:
        lines.append(f"  not in the trace (set to 0): {', '.join(fit['unfitted_terms'])}")
    if fit.get("between_steps_s"):
        lines.append(f"  fixed_s includes {fit['between_steps_s'] * 1e3:.2f} ms between busy steps (the engine loop)")
    if model.api_server_s:
        lines.append(f"  API server {model.api_server_s * 1e3:.2f} ms per request (before the engine has it)")
    if fit.get("zeroed_terms"):
        lines.append(f"  would fit negative (held at 0): {', '.join(fit['zeroed_terms'])}")
    return "\n".join(lines)
