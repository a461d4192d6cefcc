"""Structured outputs through the engine (a tiny random model: whatever it prefers, the output must
obey): every kind, n > 1, preemption, overlap scheduling, a bad constraint failing alone, the cache,
and unconstrained requests unchanged beside constrained ones."""
from __future__ import annotations

import json
import re

import partial_json_parser
import pytest

from folovllm import SamplingParams, StructuredOutputsParams
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401

SCHEMA = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "ok": {"type": "boolean"}},
          "required": ["kind", "ok"]}


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):  # noqa: F811
    return make_llm(tiny_llama_dir)


def constrained(spec: StructuredOutputsParams, **kwargs) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 60, **kwargs}, structured_outputs=spec)


def texts(llm, prompts, params) -> list[str]:
    return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]


def test_json_schema(llm) -> None:
    spec = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    for out in llm.generate(random_prompts(3), constrained(spec), use_tqdm=False):
        value = json.loads(out.outputs[0].text)
        assert value["kind"] in ("cat", "dog") and isinstance(value["ok"], bool)
        assert out.outputs[0].finish_reason == "stop"


def test_json_object(llm) -> None:
    for out in llm.generate(random_prompts(3, seed=2), constrained(StructuredOutputsParams(json_object=True)),
                            use_tqdm=False):
        text = out.outputs[0].text
        if out.outputs[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:  # cut by max_tokens: still a valid beginning of an object
            assert text.lstrip().startswith("{") and isinstance(partial_json_parser.loads(text), dict)


@pytest.mark.parametrize("spec, pattern", [
    (StructuredOutputsParams(regex=r"[ab]{3}-[0-9]"), r"[ab]{3}-[0-9]"),
    (StructuredOutputsParams(choice=["alpha", "beta", "gamma"]), r"alpha|beta|gamma"),
    (StructuredOutputsParams(grammar='root ::= "x" [0-9] [0-9]? "y"'), r"x[0-9][0-9]?y"),
])
def test_regex_choice_grammar(llm, spec, pattern) -> None:
    for out in llm.generate(random_prompts(3, seed=3), constrained(spec), use_tqdm=False):
        assert re.fullmatch(pattern, out.outputs[0].text), out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"


def test_n_samples_each_have_their_matcher(llm) -> None:
    params = constrained(StructuredOutputsParams(regex=r"[a-d]{2}[0-9]{2}"), n=4, temperature=1.0, seed=5)
    [out] = llm.generate(random_prompts(1, seed=4), params, use_tqdm=False)
    assert len(out.outputs) == 4
    for sample in out.outputs:
        assert re.fullmatch(r"[a-d]{2}[0-9]{2}", sample.text), sample.text


def test_a_complete_grammar_ends_the_request_even_with_ignore_eos(llm) -> None:
    out = llm.generate(random_prompts(1, seed=6), constrained(StructuredOutputsParams(choice=["abc"]),
                                                              ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert out.text == "abc" and out.finish_reason == "stop"


def test_unconstrained_greedy_outputs_unchanged_beside_constrained_ones(llm) -> None:
    prompts = random_prompts(4, seed=7)
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = texts(llm, prompts, plain)
    spec = StructuredOutputsParams(regex=r"[ab]{5}")
    mixed = llm.generate(prompts + prompts, [plain] * 4 + [constrained(spec)] * 4, use_tqdm=False)
    assert [o.outputs[0].text for o in mixed[:4]] == alone
    assert all(re.fullmatch(r"[ab]{5}", o.outputs[0].text) for o in mixed[4:])


def test_a_bad_constraint_fails_its_request_alone(llm) -> None:
    prompts = random_prompts(2, seed=8)
    good, bad = llm.generate(prompts, [constrained(StructuredOutputsParams(choice=["yes", "no"])),
                                       constrained(StructuredOutputsParams(regex="(unclosed"))], use_tqdm=False)
    assert good.outputs[0].text in ("yes", "no") and good.outputs[0].finish_reason == "stop"
    assert bad.outputs[0].finish_reason == "error"
    assert "invalid regex for structured outputs" in bad.outputs[0].stop_reason


def test_a_schema_compiles_once_across_requests(llm) -> None:
    cache = llm.llm_engine.structured.cache
    spec = StructuredOutputsParams(json={"type": "object", "properties": {"n": {"enum": [1, 2]}},
                                         "required": ["n"]}, disable_any_whitespace=True)
    before = cache.num_compiles
    llm.generate(random_prompts(3, seed=9), constrained(spec), use_tqdm=False)
    llm.generate(random_prompts(2, seed=10), constrained(spec), use_tqdm=False)
    assert cache.num_compiles == before + 1


def test_preemption_and_overlap_keep_constrained_outputs(tiny_llama_dir) -> None:  # noqa: F811
    prompts = random_prompts(6, seed=11, low=10, high=20)
    params = constrained(StructuredOutputsParams(regex=r"[a-z]{12}[0-9]{12}"), max_tokens=40)
    reference = texts(make_llm(tiny_llama_dir), prompts, params)
    assert all(re.fullmatch(r"[a-z]{12}[0-9]{12}", t) for t in reference)
    small = make_llm(tiny_llama_dir, num_gpu_blocks_override=16, max_model_len=64)
    assert texts(small, prompts, params) == reference
    assert small.llm_engine.stats.num_preemptions > 0
    overlapped = make_llm(tiny_llama_dir, overlap_scheduling=True)
    assert texts(overlapped, prompts, params) == reference
