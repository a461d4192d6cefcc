"""run_until_finished: steps an engine until the awaited requests finish, feeding timed arrivals."""
from __future__ import annotations

from types import SimpleNamespace

from folovllm.engine.run_loop import run_until_finished


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
