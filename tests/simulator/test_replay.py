"""The simulator schedules exactly as the engine does: the engine runs a tiny model and its every
step's batch (request id, new tokens) is recorded; the simulator, given the same requests, the same
arrival points and the engine's step durations, must produce the same sequence of batches."""
from __future__ import annotations

import numpy as np
import pytest

from folovllm.config import EngineConfig
from folovllm.sampling_params import SamplingParams
from folovllm.simulator.cluster import ClusterSpec
from folovllm.simulator.cost_model import StepShape
from folovllm.simulator.run import simulate
from folovllm.simulator.setup import SimSetup
from folovllm.simulator.workload import SimRequest

MAX_MODEL_LEN = 256


class ReplayCost:
    """The engine's measured step durations, in order."""

    name = "replay"

    def __init__(self, durations: list[float]) -> None:
        self.durations = iter(durations)

    def step_time(self, shape: StepShape) -> float:
        return next(self.durations)


def make_workload(seed: int, num: int = 14) -> list[tuple[list[int], int, int, int, str]]:
    """(prompt ids, max_tokens, step it arrives before, priority, user); a few share a 24-token prefix."""
    rng = np.random.default_rng(seed)
    shared = [int(t) for t in rng.integers(3, 512, size=24)]
    out = []
    for i in range(num):
        n = int(rng.integers(5, 60))
        ids = [int(t) for t in rng.integers(3, 512, size=n)]
        if i % 3 == 0:
            ids = shared + ids[:30]
        arrive = 0 if i < 5 else int(rng.integers(1, 25))
        out.append((ids, int(rng.integers(1, 30)), arrive, int(rng.integers(0, 3)), f"u{i % 2}"))
    return out


def run_engine(config: EngineConfig, workload) -> tuple[list, list[float], list[int], int, list]:
    """Steps the engine, adding each request before its step; returns the batches, durations, the
    step each request was added before, the KV block count and the trace's step stats."""
    from folovllm.engine.llm_engine import LLMEngine

    engine = LLMEngine(config)
    batches, durations, stats = [], [], []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        if not out.is_empty:
            batches.append([(r.request_id, n) for r, n in zip(out.requests, out.num_new_tokens)])
        return out

    engine.scheduler.schedule = recording_schedule
    pending = sorted(range(len(workload)), key=lambda i: workload[i][2])
    added_at = [0] * len(workload)
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and (workload[pending[0]][2] <= step or not engine.has_unfinished_requests()):
            i = pending.pop(0)
            ids, max_tokens, _, priority, user = workload[i]
            engine.add_request({"prompt_token_ids": ids},
                               SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                               request_id=str(i), arrival_time=float(step), priority=priority, user=user)
            added_at[i] = step
        engine.step()
        durations.append(engine.stats.last_step.duration_s)
        stats.append(engine.stats.last_step)
        step += 1
    return batches, durations, added_at, engine.kv_cache.num_blocks, stats


CASES = [("fcfs", "on-demand", True), ("fcfs", "on-demand", False), ("priority", "on-demand", True),
         ("sjf", "on-demand", True), ("fair", "on-demand", True), ("fcfs", "reserve", True),
         ("fcfs", "adaptive", True)]


@pytest.mark.parametrize("policy,admission,caching", CASES)
def test_simulated_batches_equal_the_engines(replay_model_dir, policy, admission, caching):
    config = EngineConfig(model=replay_model_dir, dtype="float32", device="cpu", block_size=4,
                          max_model_len=MAX_MODEL_LEN, num_gpu_blocks_override=72, max_num_batched_tokens=64,
                          max_num_seqs=8, scheduling_policy=policy, admission=admission,
                          enable_prefix_caching=caching, overlap_scheduling=False)
    workload = make_workload(seed=len(policy) + len(admission))
    batches, durations, added_at, num_blocks, stats = run_engine(config, workload)
    assert len(batches) == len(durations)
    starts = np.concatenate([[0.0], np.cumsum(durations)])
    requests = [SimRequest(i, float(starts[added_at[i]]), ids, len(ids), max_tokens, "", priority, user)
                for i, (ids, max_tokens, _, priority, user) in enumerate(workload)]
    requests.sort(key=lambda r: (r.arrival_s, r.index))
    setup = SimSetup(config, ReplayCost(durations), num_blocks, MAX_MODEL_LEN, ClusterSpec(), "tiny")
    run = simulate(setup, requests, keep_steps=True)
    steps = run.cluster.engines[0].steps
    assert [s.scheduled for s in steps] == batches
    if admission == "on-demand" and policy == "fcfs":
        assert run.cluster.engines[0].scheduler.num_preemptions > 0  # the small cache made it preempt
    for step, traced in zip(steps, stats):  # the trace's cost fields are the shapes the simulator sees
        assert (step.shape.num_prefill_tokens, step.shape.num_decode_rows, step.shape.num_requests,
                step.shape.context_tokens, step.shape.prefill_cached_pairs, step.shape.prefill_new_pairs) == (
                    traced.num_prefill_tokens, traced.num_decode_tokens, traced.num_scheduled,
                    traced.context_tokens, traced.prefill_cached_pairs, traced.prefill_new_pairs)
    if caching:  # prompts found their shared prefix cached: some prefill ran over computed tokens
        assert any(traced.prefill_cached_pairs for traced in stats)
    assert run.recorder.ok.all()
    assert list(run.recorder.output_len) == [w[1] for w in workload]
