"""Structured outputs in a request body: OpenAI's ``response_format``, vLLM's ``structured_outputs``
object and its older ``guided_*`` fields all become one ``StructuredOutputsParams``.

Which field asked is kept, so a constraint that does not compile (checked in this process, before
the engine sees the request) is a 400 naming it.
"""
from __future__ import annotations

import json

from folovllm.entrypoints.openai.errors import APIError, bad_request
from folovllm.entrypoints.openai.protocol import SamplingRequest
from folovllm.sampling_params import StructuredOutputsParams

__all__ = ["BACKEND_NAMES", "compile_error", "structured_outputs_from_body"]

BACKEND_NAMES = ("auto", "xgrammar")  # what guided_decoding_backend may name
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def structured_outputs_from_body(body: SamplingRequest) -> tuple[StructuredOutputsParams, str] | None:
    """The request's constraint and the field that set it, or None; APIError 400 for a malformed
    or ambiguous one (two fields that constrain, a backend this server lacks)."""
    found: list[tuple[StructuredOutputsParams, str]] = []
    field = "response_format"
    try:
        fmt = body.response_format
        if fmt is not None and fmt.type != "text":
            found.append((_from_response_format(body), field))
        field = "structured_outputs"
        if body.structured_outputs is not None:
            request = body.structured_outputs
            tag = request.structural_tag
            found.append((StructuredOutputsParams(
                json=request.json_, regex=request.regex, choice=request.choice, grammar=request.grammar,
                json_object=request.json_object,
                structural_tag=json.dumps(tag) if isinstance(tag, dict) else tag,
                disable_any_whitespace=request.disable_any_whitespace), field))
        for field, kind in _GUIDED.items():
            value = getattr(body, field)
            if value is not None:
                found.append((StructuredOutputsParams(**{kind: value}), field))
    except ValueError as err:
        raise bad_request(err, field) from err
    backend = body.guided_decoding_backend
    if backend is not None and backend not in BACKEND_NAMES:
        raise bad_request(f"guided_decoding_backend {backend!r} is not available on this server; "
                          f"use one of {', '.join(BACKEND_NAMES)} or leave it out", "guided_decoding_backend")
    if len(found) > 1:
        names = [name for _, name in found]
        raise bad_request(f"{' and '.join(names)} both constrain the output; give only one", names[1])
    return found[0] if found else None


def _from_response_format(body: SamplingRequest) -> StructuredOutputsParams:
    fmt = body.response_format
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise ValueError("response_format of type json_schema needs json_schema.schema")
        return StructuredOutputsParams(json=fmt.json_schema.json_schema)
    extra = fmt.model_extra or {}
    if "structures" not in extra:
        raise ValueError("response_format of type structural_tag needs structures (and triggers)")
    return StructuredOutputsParams(structural_tag=json.dumps({"type": "structural_tag", **extra}))


def compile_error(err: ValueError, field: str) -> APIError:
    """The 400 for a constraint that does not compile."""
    return bad_request(f"{field}: {err}", field)
