"""Request fields that ask for structured outputs map to one StructuredOutputsParams (no server)."""
from __future__ import annotations

import json

import pytest

from folovllm.entrypoints.openai.errors import APIError
from folovllm.entrypoints.openai.protocol import CompletionRequest
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.structured import structured_outputs_from_body
from folovllm.sampling_params import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
MESSAGES = [{"role": "user", "content": "Hi"}]


def spec_of(**fields) -> tuple[StructuredOutputsParams, str] | None:
    return structured_outputs_from_body(ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields}))


@pytest.mark.parametrize("fields, expected, field", [
    ({"response_format": {"type": "json_object"}}, StructuredOutputsParams(json_object=True), "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     StructuredOutputsParams(json=SCHEMA), "response_format"),
    ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}},
     StructuredOutputsParams(regex="a+", disable_any_whitespace=True), "structured_outputs"),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredOutputsParams(json=SCHEMA), "structured_outputs"),
    ({"structured_outputs": {"json_object": True}}, StructuredOutputsParams(json_object=True), "structured_outputs"),
    ({"guided_json": SCHEMA}, StructuredOutputsParams(json=SCHEMA), "guided_json"),
    ({"guided_regex": "[0-9]+"}, StructuredOutputsParams(regex="[0-9]+"), "guided_regex"),
    ({"guided_choice": ["a", "b"], "guided_decoding_backend": "xgrammar"},
     StructuredOutputsParams(choice=["a", "b"]), "guided_choice"),
    ({"guided_grammar": 'root ::= "a"'}, StructuredOutputsParams(grammar='root ::= "a"'), "guided_grammar"),
])
def test_each_spelling_maps_to_the_constraint(fields, expected, field) -> None:
    assert spec_of(**fields) == (expected, field)


def test_structural_tag_in_response_format_keeps_structures_and_triggers() -> None:
    tag = {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f>"]}
    spec, field = spec_of(response_format={"type": "structural_tag", **tag})
    assert field == "response_format" and json.loads(spec.structural_tag) == {"type": "structural_tag", **tag}


def test_no_constraint() -> None:
    assert spec_of() is None and spec_of(response_format={"type": "text"}) is None
    assert structured_outputs_from_body(CompletionRequest.model_validate({"prompt": "Hi"})) is None


@pytest.mark.parametrize("fields, param, words", [
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "both constrain the output"),
    ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json", "give only one"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_regex": "a", "guided_decoding_backend": "outlines"}, "guided_decoding_backend", "not available"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "needs json_schema.schema"),
])
def test_malformed_or_ambiguous_constraints_are_400s_naming_the_field(fields, param, words) -> None:
    with pytest.raises(APIError) as info:
        spec_of(**fields)
    assert info.value.status_code == 400 and info.value.param == param and words in info.value.message
