"""Speculative decoding through the engine: greedy output identical to no speculation (batch mixes,
chunked prefill, prefix hits, preemption, stop strings, logprobs, structured outputs), KV blocks all
returned, the counters, seeded sampling reproducible, and the switch by batch size."""
from __future__ import annotations

import re

import pytest

from folovllm import SamplingParams, StructuredOutputsParams
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def grounded_prompts(count: int, seed: int = 0) -> list[dict]:
    """Prompts that repeat a random phrase (n-gram lookup finds proposals), beside plain random ones."""
    prompts = []
    for i, tokens in enumerate(random_prompts(count, seed=seed, low=4, high=12)):
        ids = tokens * 3 if i % 3 else tokens
        prompts.append({"prompt_token_ids": ids})
    return prompts


def run(llm, prompts, params) -> list[tuple[list[int], str, str]]:
    return [(list(o.outputs[0].token_ids), o.outputs[0].text, o.outputs[0].finish_reason)
            for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def baseline(tiny_llama_dir):  # noqa: F811
    return make_llm(tiny_llama_dir)


@pytest.fixture(scope="module")
def spec(tiny_llama_dir):  # noqa: F811
    return make_llm(tiny_llama_dir, speculative_config=NGRAM)


GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)


@pytest.mark.parametrize("engine_tier", ["none", "avx2"], indirect=True)
def test_greedy_output_is_unchanged_across_tiers(tiny_llama_dir, engine_tier):  # noqa: F811
    prompts = grounded_prompts(6)
    plain = run(make_llm(tiny_llama_dir), prompts, GREEDY)
    llm = make_llm(tiny_llama_dir, speculative_config=NGRAM)
    assert run(llm, prompts, GREEDY) == plain
    stats = llm.llm_engine.stats
    assert stats.spec_decode_num_accepted_tokens > 0
    assert sum(stats.spec_decode_num_accepted_tokens_per_pos) == stats.spec_decode_num_accepted_tokens


@pytest.mark.parametrize("settings", [
    dict(max_num_batched_tokens=16, max_num_seqs=4),  # chunked prefill beside speculating decodes
    dict(num_gpu_blocks_override=40, max_model_len=160),  # KV runs out: preemption and recomputation
    dict(speculative_config={**NGRAM, "num_speculative_tokens": 6}),
], ids=["chunked", "preemption", "k6"])
def test_greedy_output_is_unchanged_under_pressure(tiny_llama_dir, baseline, settings):  # noqa: F811
    prompts = grounded_prompts(10, seed=1)
    llm = make_llm(tiny_llama_dir, **{"speculative_config": NGRAM, **settings})
    assert run(llm, prompts, GREEDY) == run(baseline, prompts, GREEDY)
    engine = llm.llm_engine
    if "num_gpu_blocks_override" in settings:
        assert engine.stats.num_preemptions > 0
    assert engine.stats.spec_decode_num_drafts > 0
    assert engine.kv_cache.num_used_blocks == 0


def test_prefix_hits_on_blocks_computed_while_speculating(spec, baseline):
    first = grounded_prompts(3, seed=2)
    outputs = run(spec, first, GREEDY)
    # the next turn's prompt holds the first answer: its blocks were written by speculating steps
    follow = [{"prompt_token_ids": p["prompt_token_ids"] + out[0] + [7, 8]} for p, out in zip(first, outputs)]
    hits_before = spec.llm_engine.kv_cache.prefix_cache_hits
    assert run(spec, follow, GREEDY) == run(baseline, follow, GREEDY)
    assert spec.llm_engine.kv_cache.prefix_cache_hits > hits_before


def test_stop_strings_max_tokens_and_logprobs(spec, baseline):
    prompts = grounded_prompts(4, seed=3)
    reference = run(baseline, prompts, GREEDY)
    stop = next(text[len(text) // 2:len(text) // 2 + 3] for _, text, _ in reference if len(text) > 8)
    for params in (SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop]),
                   SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
                   SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[reference[1][0][5]])):
        assert run(spec, prompts, params) == run(baseline, prompts, params)
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)
    got = spec.generate(prompts, with_logprobs, use_tqdm=False)
    want = baseline.generate(prompts, with_logprobs, use_tqdm=False)
    for a, b in zip(got, want):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert x.keys() == y.keys()
            assert all(x[t].logprob == pytest.approx(y[t].logprob, abs=1e-4) for t in x)


def test_structured_outputs_cut_proposals_the_grammar_refuses(spec, baseline):
    params = SamplingParams(temperature=0.0, max_tokens=40,
                            structured_outputs=StructuredOutputsParams(regex=r"([ab]{3}-[0-9]){2,4}"))
    prompts = grounded_prompts(4, seed=4)
    got = run(spec, prompts, params)
    assert got == run(baseline, prompts, params)
    assert all(re.fullmatch(r"([ab]{3}-[0-9]){2,4}", text) for _, text, _ in got)


def test_seeded_sampling_is_reproducible_and_blocks_come_back(spec):
    prompts = grounded_prompts(6, seed=5)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=25, ignore_eos=True)
    assert run(spec, prompts, params) == run(spec, prompts, params)
    stats = spec.llm_engine.stats
    assert stats.spec_decode_num_draft_tokens > stats.spec_decode_num_accepted_tokens  # rejections happened
    assert spec.llm_engine.kv_cache.num_used_blocks == 0


def test_no_proposals_above_disable_by_batch_size(tiny_llama_dir):  # noqa: F811
    llm = make_llm(tiny_llama_dir, speculative_config={**NGRAM, "disable_by_batch_size": 2})
    prompts = [{"prompt_token_ids": [5, 6, 7] * 4}] * 3  # three alike: they run and end together
    run(llm, prompts, GREEDY)
    assert llm.llm_engine.stats.spec_decode_num_drafts == 0
    run(llm, prompts[:1], GREEDY)
    assert llm.llm_engine.stats.spec_decode_num_drafts > 0


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory) -> str:
    """A one-layer random Llama with the tiny model's vocabulary: a draft that is often wrong."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from folovllm.bench.gpu_runs import save_tokenizer
    from tests.engine.conftest import TINY_VOCAB

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=2, bos_token_id=1, initializer_range=0.2, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("tiny_draft")
    LlamaForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    return str(path)


@pytest.mark.parametrize("settings", [{}, dict(max_num_batched_tokens=16, max_num_seqs=4),
                                      dict(num_gpu_blocks_override=40, max_model_len=160)],
                         ids=["plain", "chunked", "preemption"])
def test_draft_model_greedy_output_is_unchanged(tiny_llama_dir, draft_dir, baseline, settings):  # noqa: F811
    prompts = grounded_prompts(8, seed=6)
    llm = make_llm(tiny_llama_dir, speculative_config={"model": draft_dir, "num_speculative_tokens": 3}, **settings)
    assert run(llm, prompts, GREEDY) == run(baseline, prompts, GREEDY)
    engine = llm.llm_engine
    assert engine.stats.spec_decode_num_drafts > 0
    assert engine.kv_cache.num_used_blocks == 0 and engine.speculator.draft.kv_cache.num_used_blocks == 0


def test_the_target_as_its_own_draft_is_always_accepted(tiny_llama_dir, baseline):  # noqa: F811
    llm = make_llm(tiny_llama_dir, speculative_config={"model": tiny_llama_dir, "num_speculative_tokens": 3})
    prompts = grounded_prompts(4, seed=7)
    assert run(llm, prompts, GREEDY) == run(baseline, prompts, GREEDY)
    stats = llm.llm_engine.stats
    assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens > 0


def test_a_draft_of_another_vocabulary_is_refused(tiny_llama_dir, tmp_path):  # noqa: F811
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ValueError, match="vocabulary"):
        make_llm(tiny_llama_dir, speculative_config={"model": str(tmp_path), "num_speculative_tokens": 2})


def test_processors_see_the_proposals_before_each_row(spec, baseline):
    prompts = grounded_prompts(4, seed=8)
    eos = spec.llm_engine.eos_token_ids[0]
    for params in (SamplingParams(temperature=0.0, max_tokens=24, repetition_penalty=1.3, frequency_penalty=0.4),
                   SamplingParams(temperature=0.0, max_tokens=24, min_tokens=12, stop_token_ids=[eos]),
                   SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                  logit_bias={prompts[1]["prompt_token_ids"][1]: -5.0})):
        assert run(spec, prompts, params) == run(baseline, prompts, params)


def test_tensor_parallel_speculation_keeps_greedy_output(tiny_llama_dir, baseline):  # noqa: F811
    """Two gloo ranks verify the proposals (the engine proposes and settles; each rank runs its half of
    the heads over the k + 1 rows): the same tokens as one rank without speculation."""
    llm = make_llm(tiny_llama_dir, tensor_parallel_size=2, speculative_config=NGRAM)
    try:
        prompts = grounded_prompts(6, seed=7)
        assert run(llm, prompts, GREEDY) == run(baseline, prompts, GREEDY)
        assert llm.llm_engine.stats.spec_decode_num_drafts > 0  # proposals were verified across the ranks
        assert llm.llm_engine.kv_cache.num_used_blocks == 0
    finally:
        llm.llm_engine.shutdown()
