"""The step trace's cost fields: context tokens and the prefill chunks' pairs over computed tokens and
among their own new tokens."""
from types import SimpleNamespace

from folovllm.core.scheduler import SchedulerOutput
from folovllm.engine.stats import (
    context_tokens,
    prefill_cached_pairs,
    prefill_new_pairs,
    step_cost_terms,
)


def row(computed: int, total: int, outputs: int, spec: tuple[int, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(num_computed_tokens=computed, num_tokens=total, num_output_tokens=outputs,
                           spec_token_ids=list(spec))


def test_a_speculating_decode_row_is_decode_with_its_proposals():
    sched = SchedulerOutput(requests=[row(499, 500, 3, spec=(7, 8, 9))], num_new_tokens=[4])
    assert sched.num_decode_tokens() == 4
    assert step_cost_terms(sched) == (4, 503, (0, 0))


def test_cached_pairs_count_prefill_chunks_over_computed_tokens_only():
    sched = SchedulerOutput(requests=[row(384, 440, 0),  # a prefix-cache hit: 56 new over 384 cached
                                      row(0, 300, 0),  # a fresh prompt: nothing computed before
                                      row(512, 1024, 0),  # the second chunk of a long prompt
                                      row(499, 500, 3)],  # a decode row: context_tokens covers it
                            num_new_tokens=[56, 300, 256, 1])
    assert prefill_cached_pairs(sched) == 56 * 384 + 256 * 512
    assert context_tokens(sched) == 440 + 300 + 768 + 500
    assert prefill_new_pairs(sched) == (56 * 57 + 300 * 301 + 256 * 257) // 2  # each chunk over itself, causal
    assert step_cost_terms(sched) == (sched.num_decode_tokens(), context_tokens(sched),
                                      (prefill_cached_pairs(sched), prefill_new_pairs(sched))) == (1, 2008, (
                                          56 * 384 + 256 * 512, (56 * 57 + 300 * 301 + 256 * 257) // 2))


def test_a_one_token_prompt_chunk_over_a_cached_prefix_is_prefill():
    # a prompt found cached but for its last token: one new token, no output yet, so not a decode row
    sched = SchedulerOutput(requests=[row(399, 400, 0)], num_new_tokens=[1])
    assert sched.num_decode_tokens() == 0
    assert prefill_cached_pairs(sched) == 399
    assert step_cost_terms(sched) == (0, 400, (399, 1))
