"""bench serve under structured outputs: the schema option, the request body, the overhead summary."""
from __future__ import annotations

import json

import pytest

from folovllm.bench.datasets import ServeRequest
from folovllm.bench.serve_client import request_body
from folovllm.bench.structured import (
    BUILTIN_SCHEMA,
    load_schema,
    overhead_summary,
    schema_body,
)
from folovllm.sampling_params import StructuredOutputsParams


def test_builtin_and_file_schemas(tmp_path) -> None:
    assert load_schema("builtin") == BUILTIN_SCHEMA
    StructuredOutputsParams(json=BUILTIN_SCHEMA)
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"type": "object"}))
    assert load_schema(str(path)) == {"type": "object"}
    path.write_text("[1]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        load_schema(str(path))
    with pytest.raises(ValueError, match="not a readable JSON file"):
        load_schema(str(tmp_path / "missing.json"))


def test_every_request_carries_the_schema() -> None:
    body = request_body("chat", "m", ServeRequest(None, 8, 3, messages=[{"role": "user", "content": "x"}]),
                        schema_body({"type": "object"}))
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["stream"] and body["max_tokens"] == 8
    assert "response_format" not in request_body("completions", "m", ServeRequest([1, 2], 8, 2))


def test_overhead_summary_medians_and_ratio() -> None:
    summary = overhead_summary([100.0, 90.0, 110.0], [95.0, 80.0, 85.0])
    assert summary["median_unconstrained_tok_s"] == 100.0 and summary["median_constrained_tok_s"] == 85.0
    assert summary["ratio"] == pytest.approx(0.85)
    assert summary["median_round_ratio"] == pytest.approx(80 / 90)  # rounds: 0.95, 0.889, 0.773
    assert summary["spread_unconstrained"] == pytest.approx(110 / 90 - 1)
