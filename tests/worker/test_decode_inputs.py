"""Decode-only steps' inputs written in bulk (in reused buffers or a fresh block) equal ``prepare_step_batch``'s,
step after step, and the engine's tokens are the same with the buffers on and off."""
from __future__ import annotations

import random

import pytest
import torch

from folovllm import SamplingParams
from folovllm.sample.rows import SamplingRow
from folovllm.worker.decode_inputs import DecodeBatchWriter, is_decode_only
from folovllm.worker.step_batch import DecodeColumns, StepBatch, prepare_step_batch
from folovllm.worker.step_input import ScheduledRequest, StepInput
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401

BLOCK = 4
ROW = SamplingRow(SamplingParams(temperature=0.0))


def decode_step(rng: random.Random, num_requests: int) -> StepInput:
    requests = []
    for i in range(num_requests):
        position = rng.randrange(0, 40)
        table = rng.sample(range(100), position // BLOCK + 1)
        requests.append(ScheduledRequest(f"r{i}", [rng.randrange(500)], 0, position, table, ROW))
    return StepInput(requests)


def assert_same_batch(got: StepBatch, want: StepBatch) -> None:
    for name in ("input_ids", "positions", "logits_indices"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        a, b = getattr(got.attn_metadata, name), getattr(want.attn_metadata, name)
        assert a.dtype == b.dtype and a.is_contiguous() and torch.equal(a, b), name
    for name in ("query_lens", "seq_lens_list", "block_size"):
        assert getattr(got.attn_metadata, name) == getattr(want.attn_metadata, name), name
    assert got.sampling_rows == want.sampling_rows
    assert got.sampling_request_ids == want.sampling_request_ids
    assert got.pending_inputs == want.pending_inputs == [] and got.prompt_logprobs is want.prompt_logprobs is None


@pytest.mark.parametrize("reuse", [True, False])
def test_buffers_equal_prepare_step_batch_across_shapes(reuse: bool) -> None:
    rng = random.Random(0)
    writer = DecodeBatchWriter(BLOCK, torch.device("cpu"), reuse_buffers=reuse)
    # one stream whose table grows, then batches that grow, shrink and repeat a shape
    stream = [StepInput([ScheduledRequest("s", [7 + p], 0, p, list(range(50, 50 + p // BLOCK + 1)), ROW)])
              for p in range(10, 30)]
    steps = stream + [decode_step(rng, n) for n in (3, 3, 5, 1, 5, 5, 2)]
    for step in steps:
        assert is_decode_only(step)
        got = writer.batch(DecodeColumns.from_requests(step.requests), [r.sampling for r in step.requests],
                           [r.request_id for r in step.requests])
        assert_same_batch(got, prepare_step_batch(step, BLOCK, torch.device("cpu")))


def test_only_decode_steps_take_the_buffers() -> None:
    decode = ScheduledRequest("a", [5], 0, 8, [1, 2, 3], ROW)
    assert is_decode_only(StepInput([decode]))
    assert not is_decode_only(StepInput([decode, ScheduledRequest("b", [5, 6, 7], 0, 0, [4], ROW)]))  # prefill
    assert not is_decode_only(StepInput([ScheduledRequest("c", [], 1, 8, [1, 2, 3], ROW)]))  # pending input
    assert not is_decode_only(StepInput([ScheduledRequest("d", [5], 0, 3, [1])]))  # a chunk that samples nothing


@pytest.mark.parametrize("greedy", [True, False])
def test_engine_tokens_equal_with_buffers_off(tiny_llama_dir, greedy: bool) -> None:  # noqa: F811
    params = SamplingParams(temperature=0.0 if greedy else 0.9, seed=None if greedy else 5, max_tokens=12,
                            ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, seed=2)]
    llm = make_llm(tiny_llama_dir)
    runner = llm.llm_engine.worker.runner
    assert runner.decode_writer.reuse_buffers  # the CPU platform is synchronous: the buffers are on
    tokens = {}
    for on in (True, False):
        runner.decode_writer = DecodeBatchWriter(runner.block_size, runner.device, reuse_buffers=on)
        tokens[on] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens[True] == tokens[False]
