"""What the worker keeps of each request: decode rows built from it give the batch the same requests sent in
full give, step after step (tables that grow, rows reused after a request ends, steps that mix both forms,
tokens pending on the device), each row's output count included; the same rows sent in full again (``in_full``,
for a CUDA graph); RNGs and kept state go when a request ends."""
from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import torch

from folovllm import SamplingParams
from folovllm.platforms import platform_for
from folovllm.sample.rows import SamplingRow
from folovllm.worker.model_runner import ModelRunner
from folovllm.worker.request_states import RequestStates
from folovllm.worker.step_batch import StepBatch, prepare_step_batch
from folovllm.worker.step_input import DecodeRows, ScheduledRequest, StepInput

BLOCK = 4
GREEDY = SamplingRow(SamplingParams(temperature=0.0))
SAMPLED = SamplingRow(SamplingParams(temperature=0.8, seed=3), seed=3)


def runner(reuse_buffers: bool = True) -> ModelRunner:
    """A runner whose model is never called: only its batch building is exercised."""
    model = SimpleNamespace(arch=SimpleNamespace(vocab_size=100))
    return ModelRunner(model, [], BLOCK, platform_for(torch.device("cpu")), decode_input_buffers=reuse_buffers)


class Sequence:
    """One request as the engine would send it: its table grows a block every BLOCK tokens."""

    def __init__(self, rid: str, rng: random.Random, pool: list[int]) -> None:
        self.rid, self.rng, self.pool = rid, rng, pool
        self.position = rng.randrange(3, 20)
        self.table = [pool.pop() for _ in range(self.position // BLOCK + 1)]
        self.row = rng.choice([GREEDY, SAMPLED])
        self.count = rng.randrange(1, 5)  # tokens output so far: one more per position

    def sampling(self) -> SamplingRow:
        return replace(self.row, num_output_tokens=self.count)

    def advance(self) -> tuple[int, list[int]] | None:
        """One token further; the blocks its table gained, as (first index, blocks)."""
        self.position += 1
        self.count += 1
        if self.position // BLOCK + 1 > len(self.table):
            self.table.append(self.pool.pop())
            return len(self.table) - 1, self.table[-1:]
        return None

    def full(self, keep: bool, pending: bool = False) -> ScheduledRequest:
        token = [] if pending else [self.rng.randrange(100)]
        return ScheduledRequest(self.rid, token, int(pending), self.position, list(self.table), self.sampling(),
                                keep=keep)


def as_general(step: StepInput, sequences: dict[str, Sequence]) -> StepInput:
    """The same step with every decode row sent in full."""
    decodes = step.decodes
    extra = [ScheduledRequest(rid, [] if row in decodes.pending_rows else [decodes.token_ids[row]],
                              int(row in decodes.pending_rows), decodes.positions[row], list(sequences[rid].table),
                              sequences[rid].sampling())
             for row, rid in enumerate(decodes.request_ids)]
    return StepInput(step.requests + extra, step.finished_request_ids)


def assert_same_step(got: StepBatch, want: StepBatch) -> None:
    assert_same_batch_fields(got, want)
    assert got.pending_inputs == want.pending_inputs


def assert_same_batch_fields(got: StepBatch, want: StepBatch) -> None:
    for name in ("input_ids", "positions", "logits_indices"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        assert torch.equal(getattr(got.attn_metadata, name), getattr(want.attn_metadata, name)), name
    assert got.attn_metadata.seq_lens_list == want.attn_metadata.seq_lens_list
    assert got.sampling_request_ids == want.sampling_request_ids
    settings = [replace(r, num_output_tokens=0) for r in got.sampling_rows]
    assert settings == [replace(r, num_output_tokens=0) for r in want.sampling_rows]
    counts = ModelRunner._output_counts(got)
    counts = [r.num_output_tokens for r in got.sampling_rows] if counts is None else counts.tolist()
    assert counts == [r.num_output_tokens for r in want.sampling_rows]  # a kept row's own count is stale


def test_decode_rows_build_the_batch_of_the_full_rows() -> None:
    rng = random.Random(0)
    pool = list(range(1000))
    rng.shuffle(pool)
    run = runner()
    live: dict[str, Sequence] = {}
    kept: set[str] = set()
    for step_index in range(40):
        finished = [rid for rid in live if rng.random() < 0.1]
        for rid in finished:
            del live[rid]
            kept.discard(rid)
        for _ in range(rng.randrange(0, 3)):  # newcomers, sent in full and kept
            rid = f"r{step_index}-{rng.randrange(10**6)}"
            live[rid] = Sequence(rid, rng, pool)
        general, decode_ids, new_blocks = [], [], {}
        for rid, seq in live.items():
            grown = seq.advance() if rid in kept else None
            if rid in kept and rng.random() < 0.8:
                decode_ids.append(rid)
                if grown:
                    new_blocks[rid] = grown
            else:  # in full (a newcomer, or a kept one the engine sends in full this step)
                general.append(seq.full(keep=True))
        pending = [row for row in range(len(decode_ids)) if rng.random() < 0.3] if step_index % 3 == 0 else []
        tokens = [0 if row in pending else rng.randrange(100) for row in range(len(decode_ids))]
        decodes = DecodeRows(decode_ids, tokens, [live[r].position for r in decode_ids], pending, new_blocks)
        step = StepInput(general, finished, decodes if decode_ids else None)
        for rid in finished:
            run.forget(rid)
        run.states.update(step)
        got = run._prepare(step)
        full = as_general(step, live) if decode_ids else step
        want = prepare_step_batch(full, BLOCK, torch.device("cpu"))
        assert_same_step(got, want)
        if decode_ids:
            assert run.states.in_full(step) == full
        assert got.kept_rows_only == (not general and bool(decode_ids))
        kept.update(r.request_id for r in general)
    assert set(run.states.row_of) == kept


def test_rows_are_reused_and_generators_dropped() -> None:
    states = RequestStates(torch.device("cpu"))
    first = ScheduledRequest("a", [1], 0, 5, [7, 8], SAMPLED, keep=True)
    states.update(StepInput([first, ScheduledRequest("b", [2], 0, 1, [9], GREEDY, keep=True)]))
    assert states.generator("a", 3) is states.generator("a", 3)  # one RNG per request
    row = states.row_of["a"]
    assert states.num_blocks[row] == 2 and list(states.tables[row, :2]) == [7, 8]
    states.update(StepInput([], decodes=DecodeRows(["a"], [4], [8], new_blocks={"a": (2, [11])})))
    assert list(states.tables[row, :3]) == [7, 8, 11] and states.num_blocks[row] == 3
    states.forget("a")
    assert "a" not in states.generators and "a" not in states.row_of
    states.update(StepInput([ScheduledRequest("c", [3], 0, 0, [5], GREEDY, keep=True)]))
    assert states.row_of["c"] == row  # the freed row, its old table gone past the new one
    assert states.num_blocks[row] == 1 and list(states.tables[row, :3]) == [5, 0, 0]
    assert bool(states.plain_greedy[row]) and not states.any_lora
