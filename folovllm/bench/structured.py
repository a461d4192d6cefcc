"""``bench serve`` under structured outputs: every request carries one JSON schema (a file, or a
built-in one), and ``--structured-rounds N`` alternates N unconstrained and N constrained runs of
the same requests to report the constraint's cost as a ratio of median output tok/s."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

# A long first string keeps every request generating to its max_tokens, as unconstrained ones do with
# ignore_eos, so both sides run the same batch sizes and the ratio is the constraint's cost alone.
BUILTIN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "minLength": 400},
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["summary", "title", "year", "tags", "notes"],
}


def load_schema(source: str) -> dict[str, Any]:
    """``builtin`` or the path of a JSON file holding the schema."""
    if source == "builtin":
        return BUILTIN_SCHEMA
    try:
        schema = json.loads(Path(source).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--structured-json-schema {source!r}: not a readable JSON file ({err}).") from None
    if not isinstance(schema, dict):
        raise ValueError(f"--structured-json-schema {source!r} must hold a JSON object (a schema).")
    return schema


def schema_body(schema: dict[str, Any]) -> dict[str, Any]:
    """The request fields that put a request under ``schema`` (OpenAI's response_format)."""
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "bench", "schema": schema, "strict": True}}}


def overhead_summary(free_tok_s: list[float], constrained_tok_s: list[float]) -> dict[str, Any]:
    """Median output tok/s of each side, their ratio, the median of the per-round ratios (robust to
    a machine whose speed drifts between rounds), and each side's spread (max/min - 1)."""
    free, constrained = statistics.median(free_tok_s), statistics.median(constrained_tok_s)
    paired = [c / f if f > 0 else float("nan") for f, c in zip(free_tok_s, constrained_tok_s)]
    return {"unconstrained_tok_s": free_tok_s, "constrained_tok_s": constrained_tok_s,
            "median_unconstrained_tok_s": free, "median_constrained_tok_s": constrained,
            "ratio": constrained / free if free > 0 else float("nan"),
            "round_ratios": paired, "median_round_ratio": statistics.median(paired),
            "spread_unconstrained": max(free_tok_s) / min(free_tok_s) - 1 if min(free_tok_s) > 0 else float("nan"),
            "spread_constrained": (max(constrained_tok_s) / min(constrained_tok_s) - 1
                                   if min(constrained_tok_s) > 0 else float("nan"))}


def format_overhead(summary: dict[str, Any]) -> str:
    rounds = ", ".join(f"{a:,.1f} / {b:,.1f}" for a, b in zip(summary["unconstrained_tok_s"],
                                                              summary["constrained_tok_s"]))
    return "\n".join([
        "=== structured outputs overhead (output tok/s, unconstrained / constrained per round) ===",
        f"rounds: {rounds}",
        f"median unconstrained: {summary['median_unconstrained_tok_s']:,.1f} tok/s "
        f"(spread {summary['spread_unconstrained']:.0%})",
        f"median constrained:   {summary['median_constrained_tok_s']:,.1f} tok/s "
        f"(spread {summary['spread_constrained']:.0%})",
        f"ratio of the medians, constrained / unconstrained: {summary['ratio']:.3f}",
        f"per-round ratios: {', '.join(f'{r:.3f}' for r in summary['round_ratios'])} "
        f"(median {summary['median_round_ratio']:.3f})",
    ])
