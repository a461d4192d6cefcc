"""Stepping an engine until the requests a caller waits for have finished (offline use, benchmarks)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from folovllm.outputs import RequestOutput

if TYPE_CHECKING:
    from folovllm.engine.llm_engine import LLMEngine


def run_until_finished(engine: LLMEngine, request_ids: Iterable[str], *,
                       arrivals: Callable[[], list[str] | None] | None = None,
                       on_step: Callable[[list[RequestOutput]], None] | None = None,
                       ) -> dict[str, RequestOutput]:
    """Steps ``engine`` until every request of ``request_ids`` has finished; returns their final
    outputs by id. Stops early if the engine runs out of work (a request that never finished is absent).

    ``arrivals``: called before each step to add the requests that are due; returns their ids, or
    None once it has nothing left to add. While it has more, an idle engine keeps calling it (it may
    sleep until the next arrival). ``on_step``: called after each step with that step's outputs.
    """
    with torch.inference_mode():  # once for the whole loop: entering it costs the worker tens of µs a step
        return _run(engine, set(request_ids), arrivals, on_step)


def _run(engine: LLMEngine, wanted: set[str], arrivals: Callable[[], list[str] | None] | None,
         on_step: Callable[[list[RequestOutput]], None] | None) -> dict[str, RequestOutput]:
    finished: dict[str, RequestOutput] = {}
    more_to_come = arrivals is not None
    while True:
        if more_to_come:
            added = arrivals()
            if added is None:
                more_to_come = False
            else:
                wanted.update(added)
        if not more_to_come and len(finished) == len(wanted):
            break
        if not engine.has_unfinished_requests():
            if more_to_come:
                continue
            break
        outputs = engine.step()
        for output in outputs:
            if output.finished and output.request_id in wanted:
                finished[output.request_id] = output
        if on_step is not None:
            on_step(outputs)
    return finished
