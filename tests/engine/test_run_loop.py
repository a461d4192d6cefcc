"""run_until_finished: steps an engine until the awaited requests finish, feeding timed arrivals."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from folovllm import SamplingParams
from folovllm.engine.run_loop import run_until_finished
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401


class FakeEngine:
    """Each request finishes after ``steps`` steps; records every step."""

    def __init__(self, steps: int) -> None:
        self.steps, self.left, self.num_steps = steps, {}, 0

    def add(self, request_id: str) -> str:
        self.left[request_id] = self.steps
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.left)

    def step(self) -> list[SimpleNamespace]:
        self.num_steps += 1
        outputs = []
        for request_id in list(self.left):
            self.left[request_id] -= 1
            finished = self.left[request_id] == 0
            if finished:
                del self.left[request_id]
            outputs.append(SimpleNamespace(request_id=request_id, finished=finished))
        return outputs


def test_runs_until_the_awaited_requests_finish() -> None:
    engine = FakeEngine(steps=3)
    ids = [engine.add("a"), engine.add("b")]
    seen = []
    finished = run_until_finished(engine, ids, on_step=seen.append)
    assert set(finished) == {"a", "b"} and all(o.finished for o in finished.values())
    assert engine.num_steps == len(seen) == 3


def test_arrivals_are_fed_until_exhausted() -> None:
    engine = FakeEngine(steps=2)
    schedule = [["a"], [], ["b"]]  # ids due before each call; then nothing more

    def arrivals() -> list[str] | None:
        return [engine.add(i) for i in schedule.pop(0)] if schedule else None

    finished = run_until_finished(engine, [], arrivals=arrivals)
    assert set(finished) == {"a", "b"} and not engine.has_unfinished_requests()


def test_steps_run_in_inference_mode_entered_once() -> None:
    engine = FakeEngine(steps=2)
    modes = []
    step = engine.step
    engine.step = lambda: modes.append(torch.is_inference_mode_enabled()) or step()
    run_until_finished(engine, [engine.add("a")])
    assert modes == [True, True] and not torch.is_inference_mode_enabled()


def test_the_runner_enters_inference_mode_when_no_loop_has(tiny_llama_dir) -> None:  # noqa: F811
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    engine = make_llm(tiny_llama_dir).llm_engine
    runner, modes = engine.worker.runner, []
    forward = runner._forward
    runner._forward = lambda batch: modes.append(torch.is_inference_mode_enabled()) or forward(batch)
    outside = []
    for prompt in random_prompts(2, seed=4):  # stepped by hand: no loop entered inference mode
        engine.add_request({"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():
        outside += [o for o in engine.step() if o.finished]
    inside = run_until_finished(engine, [engine.add_request({"prompt_token_ids": p}, params)
                                         for p in random_prompts(2, seed=4)])
    assert [o.outputs[0].token_ids for o in sorted(outside, key=lambda o: int(o.request_id))] == \
        [o.outputs[0].token_ids for o in inside.values()]
    assert len(modes) == 10 and all(modes)  # 2 x (prompt + 4 decode steps), each in inference mode
