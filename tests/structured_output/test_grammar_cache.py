"""The grammar cache: a spec compiles once (on its threads), a bad one fails with a ValueError that
says what is wrong, and the cache stays bounded."""
from __future__ import annotations

import json

import pytest

from folovllm.sampling_params import StructuredOutputsParams
from folovllm.structured_output import GrammarCache, spec_key

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def cache(smol_tokenizer):
    cache = GrammarCache("auto", smol_tokenizer, None, [2])
    yield cache
    cache.close()


def test_a_schema_compiles_once_whatever_its_form(cache) -> None:
    before = cache.num_compiles
    first = cache.get(StructuredOutputsParams(json=SCHEMA)).result(timeout=60)
    again = cache.get(StructuredOutputsParams(json=json.dumps(SCHEMA, indent=2))).result(timeout=60)
    assert again is first
    assert cache.num_compiles == before + 1 and cache.num_hits >= 1


def test_whitespace_option_is_part_of_the_key() -> None:
    assert spec_key(StructuredOutputsParams(json=SCHEMA)) != spec_key(
        StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True))


@pytest.mark.parametrize("spec, words", [
    (StructuredOutputsParams(regex="("), "regex"),
    (StructuredOutputsParams(json='{"type": 5}'), "json"),
    (StructuredOutputsParams(json="{not json"), "json"),
    (StructuredOutputsParams(grammar='root ::= "a" |'), "grammar"),
    (StructuredOutputsParams(structural_tag="[1"), "structural_tag"),
])
def test_a_bad_spec_fails_with_a_clear_value_error(cache, spec, words) -> None:
    with pytest.raises(ValueError, match=f"invalid {words} for structured outputs: ") as info:
        cache.get(spec).result(timeout=60)
    assert ".cc:" not in str(info.value)  # the library's source location is dropped


def test_the_cache_is_bounded(smol_tokenizer) -> None:
    small = GrammarCache("xgrammar", smol_tokenizer, None, [2], max_entries=2)
    try:
        for pattern in ("a", "b", "c"):
            small.get(StructuredOutputsParams(regex=pattern)).result(timeout=60)
        small.get(StructuredOutputsParams(regex="a")).result(timeout=60)
        assert small.num_compiles == 4  # "a" was dropped to keep two entries
    finally:
        small.close()


def test_unknown_backend_names_the_supported_ones(smol_tokenizer) -> None:
    with pytest.raises(ValueError, match="supported: \\['xgrammar'\\]"):
        GrammarCache("guidance", smol_tokenizer, None, [2]).backend
