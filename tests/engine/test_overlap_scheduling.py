"""Overlap scheduling (step N+1 scheduled and launched before step N's tokens are read) changes when
tokens are handed out, never which: outputs equal the plain loop's, stops stay exact. On CPU the
forward is synchronous, so overlap is forced on here (it is on by default on CUDA only)."""
import pytest

from folovllm import SamplingParams
from tests.engine.conftest import make_llm, random_prompts
from tests.engine.test_batching_consistency import assert_same, run

PARAMS = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(8, seed=3)


@pytest.fixture(scope="module")
def plain(tiny_llama_dir, prompts):
    return run(make_llm(tiny_llama_dir, overlap_scheduling=False), prompts, PARAMS)


def test_overlap_hands_tokens_out_one_step_later(tiny_llama_dir, prompts):
    outputs = {}
    for overlap in (False, True):
        engine = make_llm(tiny_llama_dir, overlap_scheduling=overlap).llm_engine
        engine.add_request({"prompt_token_ids": prompts[0]}, PARAMS)
        outputs[overlap] = [len(engine.step()), len(engine.step())]
    assert outputs[False] == [1, 1]
    assert outputs[True] == [0, 1]  # the first step's token is read while the second one runs


@pytest.mark.parametrize("engine_args", [
    dict(),
    dict(max_num_batched_tokens=16),  # chunked prefill across steps
    dict(num_gpu_blocks_override=16, max_model_len=64),  # preemption by recompute
    dict(max_num_seqs=3),  # requests join as others finish
], ids=["plain", "chunked", "preempting", "joining"])
def test_greedy_outputs_equal_with_overlap(tiny_llama_dir, prompts, plain, engine_args):
    llm = make_llm(tiny_llama_dir, overlap_scheduling=True, **engine_args)
    assert_same(run(llm, prompts, PARAMS), plain)
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache.num_used_blocks == 0
    if "num_gpu_blocks_override" in engine_args:
        assert engine.scheduler.num_preemptions > 0


def test_stops_are_exact_with_overlap(tiny_llama_dir, prompts, plain):
    """A request that stops in step N gets no token from step N+1 (already launched for it)."""
    stop_params = []
    for completion, max_tokens in zip(plain, [3, 5, 8, 20, 1, 2, 13, 20]):
        stop_token = completion.token_ids[max_tokens - 1] if max_tokens < 20 else None
        stop_params.append(SamplingParams(
            temperature=0.0, max_tokens=20, ignore_eos=True,
            stop_token_ids=[stop_token] if stop_token is not None else None))
    results = {}
    for overlap in (False, True):
        llm = make_llm(tiny_llama_dir, overlap_scheduling=overlap, max_num_seqs=4)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], stop_params, use_tqdm=False)
        results[overlap] = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs]
        assert llm.llm_engine.kv_cache.num_used_blocks == 0
    assert results[True] == results[False]
    assert any(reason == "stop" for _, reason in results[True])


def test_penalties_seeds_and_n_with_overlap(tiny_llama_dir, prompts):
    """Penalty requests wait for their pending token (sync step); seeded sampling and n > 1 match."""
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=1.3),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, frequency_penalty=1.0),
              SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=7),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, ignore_eos=True, seed=3, n=2)]
    results = {}
    for overlap in (False, True):
        llm = make_llm(tiny_llama_dir, overlap_scheduling=overlap)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], params, use_tqdm=False)
        results[overlap] = [[c.token_ids for c in o.outputs] for o in outs]
    assert results[True] == results[False]


def test_abort_while_a_step_is_in_flight(tiny_llama_dir, prompts):
    engine = make_llm(tiny_llama_dir, overlap_scheduling=True).llm_engine
    for i, prompt in enumerate(prompts[:3]):
        engine.add_request({"prompt_token_ids": prompt}, PARAMS, request_id=str(i))
    engine.step()
    engine.step()
    engine.abort_request("1")  # its next token is already being computed
    seen = set()
    while engine.has_unfinished_requests():
        seen.update(o.request_id for o in engine.step())
    assert "1" not in seen and {"0", "2"} <= seen
    assert engine.kv_cache.num_used_blocks == 0


def test_prefix_cache_names_only_known_tokens_with_overlap(tiny_llama_dir, prompts):
    """Blocks completed by a still-pending token are named once it lands: same hits either way."""
    shared = prompts[0][:12]
    turns = [shared + p[:5] for p in prompts[1:6]]
    results = {}
    for overlap in (False, True):
        llm = make_llm(tiny_llama_dir, overlap_scheduling=overlap)
        first = run(llm, [shared], SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True))[0]
        again = run(llm, [shared + first.token_ids] + turns, PARAMS)  # reuses the generated blocks too
        stats = llm.llm_engine.stats
        results[overlap] = ([c.token_ids for c in again], stats.prefix_cache_hits)
    assert results[True] == results[False]
    assert results[True][1] >= 20


def test_final_only_outputs_skip_the_steps_in_between(tiny_llama_dir, prompts):
    """output_kind="final_only" (what LLM.generate uses): one output per request, when it ends."""
    for kind, expected_per_request in (("cumulative", 20), ("final_only", 1)):
        engine = make_llm(tiny_llama_dir).llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, output_kind=kind)
        for prompt in prompts[:3]:
            engine.add_request({"prompt_token_ids": prompt}, params)
        seen = []
        while engine.has_unfinished_requests():
            seen.extend(engine.step())
        assert len(seen) == 3 * expected_per_request
        assert sum(o.finished for o in seen) == 3 and all(len(o.outputs[0].token_ids) == 20 for o in seen[-3:])


def test_bad_words_with_overlap(tiny_llama_dir, prompts, monkeypatch):
    """Bad words read the latest outputs: a step with them waits for its pending token (sync step)."""
    from folovllm.engine import prompt_checks

    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    free = run(make_llm(tiny_llama_dir), prompts[:1], params)[0].token_ids
    word = (free[3], free[4])  # a two-token word the free run completes with its fifth token
    assert all(pair != word for pair in zip(free[:4], free[1:4]))  # and not before
    # the word as token ids: the tiny model's vocabulary is not the tokenizer's
    monkeypatch.setattr(prompt_checks, "bad_words_token_ids", lambda words, tokenizer: (word,))
    banned = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, bad_words=["w"])
    results = {overlap: run(make_llm(tiny_llama_dir, overlap_scheduling=overlap), prompts[:1], banned)[0].token_ids
               for overlap in (False, True)}
    assert results[True] == results[False]
    assert results[False][:4] == free[:4] and results[False][4] != free[4]
