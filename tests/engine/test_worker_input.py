"""SchedulerOutput -> StepInput: known and pending tokens, who samples, what each sampling row carries."""
from __future__ import annotations

import pytest

from folovllm.core.scheduler import SchedulerOutput
from folovllm.engine.worker_input import StepInputBuilder, build_step_input, sampling_row
from folovllm.request import Request, bad_words_token_ids
from folovllm.sampling_params import SamplingParams


def request(rid: str, params: SamplingParams, prompt_len: int = 6, sample_index: int = 0) -> Request:
    return Request(rid, list(range(10, 10 + prompt_len)), params, 0.0, 16, [2], sample_index)


def test_chunks_pending_tokens_and_sampling_rows() -> None:
    chunked = request("chunked", SamplingParams(temperature=0.0))
    done_prompt = request("prompt", SamplingParams(temperature=0.5, seed=7), sample_index=1)
    decoding = request("decode", SamplingParams(temperature=0.0, presence_penalty=0.5, min_tokens=3))
    decoding.num_computed_tokens = 6
    decoding.append_output_token(42)
    decoding.num_computed_tokens = 7
    decoding.num_pending_tokens = 1  # sampled by the step in flight
    sched = SchedulerOutput()
    sched.add(chunked, 4, [0])
    sched.add(done_prompt, 6, [1, 2])
    sched.add(decoding, 1, [3, 4])
    step, sampled = build_step_input(sched, ["gone"])

    assert step.finished_request_ids == ["gone"]
    assert sampled == [done_prompt, decoding]
    first, second, third = step.requests
    assert (first.new_token_ids, first.num_pending_tokens, first.num_computed_tokens) == ([10, 11, 12, 13], 0, 0)
    assert first.sampling is None  # two prompt tokens still to go
    assert second.num_new_tokens == 6 and second.block_table == [1, 2]
    assert second.sampling.seed == 8 and second.sampling.prompt_token_ids == ()
    assert (third.new_token_ids, third.num_pending_tokens, third.num_computed_tokens) == ([], 1, 7)
    row = third.sampling
    assert row.num_output_tokens == 2 and row.stop_token_ids == (2,)
    assert list(row.prompt_token_ids) == list(range(10, 16)) and list(row.output_token_ids) == [42]


def test_bad_words_rows_carry_outputs_only() -> None:
    words = ((5,), (6, 7))
    req = Request("bw", [10, 11], SamplingParams(temperature=0.0), 0.0, 16, [2], bad_words_token_ids=words)
    req.append_output_token(6)
    row = sampling_row(req)
    assert row.bad_words_token_ids == words and list(row.output_token_ids) == [6]
    assert row.prompt_token_ids == ()  # no penalty: the prompt is not sent
    plain = sampling_row(request("plain", SamplingParams(temperature=0.0)))
    assert plain.bad_words_token_ids == () and plain.output_token_ids == ()


class _Tokenizer:
    """Words to ids the way a byte-level BPE might: "ab" is two tokens bare, one with a space."""

    table = {"a": [1], " a": [2], "ab": [1, 3], " ab": [4], "x y": [5, 6, 7], " x y": [8, 6, 7]}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.table.get(text, [])


def test_bad_words_tokenized_bare_and_with_a_space() -> None:
    # " ab" has fewer tokens than "ab": only the bare form is kept (vLLM's rule)
    assert bad_words_token_ids(["a", " ab", "x y"], _Tokenizer()) == ((1,), (2,), (1, 3), (5, 6, 7), (8, 6, 7))
    with pytest.raises(ValueError, match="bad_words"):
        bad_words_token_ids(["zzz"], _Tokenizer())


def test_stop_token_ids_one_rule() -> None:
    params = SamplingParams(stop_token_ids=[5])
    assert request("a", params).stop_token_ids == (5, 2)
    assert request("b", SamplingParams(stop_token_ids=[5], ignore_eos=True)).stop_token_ids == (5,)


def test_prompt_logprob_rows_name_the_next_prompt_tokens() -> None:
    asks = request("asks", SamplingParams(prompt_logprobs=2), prompt_len=6)  # tokens 10..15
    plain = request("plain", SamplingParams())
    sched = SchedulerOutput()
    sched.add(asks, 4, [0])
    sched.add(plain, 6, [1, 2])
    step, _ = build_step_input(sched, [])
    first = step.requests[0].prompt_logprobs
    assert (first.num_logprobs, first.first_position, first.target_token_ids) == (2, 1, [11, 12, 13, 14])
    assert step.requests[1].prompt_logprobs is None

    asks.num_computed_tokens = 4  # the last chunk: its last row predicts the first output token
    sched = SchedulerOutput()
    sched.add(asks, 2, [0, 1])
    last = build_step_input(sched, [])[0].requests[0].prompt_logprobs
    assert (last.first_position, last.target_token_ids) == (5, [15])

    sample = request("other-sample", SamplingParams(prompt_logprobs=2), sample_index=1)
    sched = SchedulerOutput()
    sched.add(sample, 6, [0, 1])
    assert build_step_input(sched, [])[0].requests[0].prompt_logprobs is None  # sample 0 scores the prompt


def test_kept_requests_come_back_as_decode_rows() -> None:
    """A request whose row may be kept is sent in full once (``keep``); then its one-token steps are decode rows
    (a pending token among them), after the full rows; a preempted or finished request is sent in full again."""
    builder = StepInputBuilder(None, decode_rows=True)
    kept = request("kept", SamplingParams(temperature=0.0))
    penalized = request("pen", SamplingParams(temperature=0.0, presence_penalty=0.5))  # reads its outputs
    first = SchedulerOutput()
    first.add(kept, 6, [0, 1])
    first.add(penalized, 6, [2, 3])
    step, sampled = builder.build(first, [])
    assert [r.keep for r in step.requests] == [True, False] and step.decodes is None
    builder.launched(step)
    for r in (kept, penalized):
        r.num_computed_tokens = 6
        r.append_output_token(42)

    second = SchedulerOutput(new_block_ids={"kept": (2, [9]), "pen": (2, [8])})
    second.add(kept, 1, [0, 1, 9])
    second.add(penalized, 1, [2, 3, 8])
    step, sampled = builder.build(second, [])
    assert [r.request_id for r in step.requests] == ["pen"] and sampled == [penalized, kept]
    decodes = step.decodes
    assert (decodes.request_ids, decodes.token_ids, decodes.positions) == (["kept"], [42], [6])
    assert decodes.new_blocks == {"kept": (2, [9])} and decodes.pending_rows == []
    builder.launched(step)

    kept.num_computed_tokens, kept.num_pending_tokens = 7, 1  # overlap: its token is on the device
    third = SchedulerOutput()
    third.add(kept, 1, [0, 1, 9])
    step, _ = builder.build(third, [])
    assert step.decodes.pending_rows == [0] and step.decodes.token_ids == [0]

    preempted = SchedulerOutput(preempted=[kept])
    step, _ = builder.build(preempted, [])
    assert builder.kept == set()
    builder.kept.add("kept")
    step, _ = builder.build(third, ["kept"])  # it ended: the worker forgets it first
    assert step.decodes is None and step.requests[0].request_id == "kept" and step.requests[0].keep


def test_without_decode_rows_every_request_is_sent_in_full() -> None:
    a = request("a", SamplingParams(temperature=0.0))
    sched = SchedulerOutput()
    sched.add(a, 6, [0, 1])
    step, _ = build_step_input(sched, [])
    assert not step.requests[0].keep and step.decodes is None
