"""The xgrammar backend: bitmasks as wide as the model's logits, stop tokens after a complete
grammar, choices with characters that need escaping."""
from __future__ import annotations

import numpy as np
import pytest

from folovllm.sampling_params import StructuredOutputsParams
from folovllm.structured_output import make_backend


def allowed(backend, matcher) -> set[int]:
    bitmask = np.zeros((1, backend.bitmask_width), dtype=np.int32)
    backend.fill_bitmask([matcher], bitmask)
    bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:backend.vocab_size]
    return set(np.flatnonzero(bits).tolist())


@pytest.fixture(scope="module")
def backend(smol_tokenizer):
    return make_backend("auto", smol_tokenizer, len(smol_tokenizer) + 64, [2])  # padded logits


def test_padded_vocab_ids_are_never_allowed(backend, smol_tokenizer) -> None:
    matcher = backend.new_matcher(backend.compile(StructuredOutputsParams(json_object=True)), [])
    ids = allowed(backend, matcher)
    assert ids and max(ids) < len(smol_tokenizer)


def test_a_complete_grammar_allows_only_stop_tokens(backend, smol_tokenizer) -> None:
    choice = ['say "hi"\\n', "no"]
    matcher = backend.new_matcher(backend.compile(StructuredOutputsParams(choice=choice)), [7, 2])
    for token in smol_tokenizer.encode(choice[0], add_special_tokens=False):
        assert matcher.accept_token(token)
    assert allowed(backend, matcher) == {7, 2}
    assert matcher.accept_token(7) and matcher.is_terminated()


def test_structural_tag_in_the_openai_form(backend, smol_tokenizer) -> None:
    tag = ('{"type": "structural_tag", "structures": [{"begin": "<f>", "schema": {"type": "object", '
           '"properties": {"a": {"type": "integer"}}, "required": ["a"]}, "end": "</f>"}], "triggers": ["<f>"]}')
    matcher = backend.new_matcher(backend.compile(StructuredOutputsParams(structural_tag=tag)), [2])
    for token in smol_tokenizer.encode('ok <f>{"a": 1}</f>', add_special_tokens=False):
        assert matcher.accept_token(token)
