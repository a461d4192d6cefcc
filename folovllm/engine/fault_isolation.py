"""When a step fails as a whole, find the request(s) it fails on by launching the batch in halves.

Launching a step changes no request state (``num_computed_tokens`` moves only once it launched) and
writes K/V only into slots the scheduler already gave each request, which a relaunch writes again with
the same values; so a failed batch can be retried in parts. A part that launches is kept and its tokens
are used as usual; a request that fails even alone is blamed. If every request fails alone (a fault
that is no request's doing), every one of them is blamed: the step's requests end, the engine goes on.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from folovllm.core.scheduler import SchedulerOutput
from folovllm.request import Request

Launched = TypeVar("Launched")


def subset(sched: SchedulerOutput, rows: list[int]) -> SchedulerOutput:
    """The scheduled requests at ``rows``, as a step of their own (preemptions stay with the whole)."""
    part = SchedulerOutput(new_block_ids=sched.new_block_ids)
    for row in rows:
        part.add(sched.requests[row], sched.num_new_tokens[row], sched.block_tables[row])
    return part


def isolate_faults(sched: SchedulerOutput, launch: Callable[[SchedulerOutput], Launched]
                   ) -> tuple[list[tuple[SchedulerOutput, Launched]], list[Request]]:
    """Launches ``sched`` (whole first: the fault may have passed), then failing parts in halves.

    Returns the parts that launched, each with what ``launch`` returned, and the requests that fail
    alone. At most ``2 * len(sched.requests)`` launches.
    """
    launched: list[tuple[SchedulerOutput, Launched]] = []
    culprits: list[Request] = []

    def visit(rows: list[int]) -> None:
        part = subset(sched, rows)
        try:
            launched.append((part, launch(part)))
            return
        except Exception:
            if len(rows) == 1:
                culprits.append(sched.requests[rows[0]])
                return
        middle = len(rows) // 2
        visit(rows[:middle])
        visit(rows[middle:])

    if not sched.is_empty:
        visit(list(range(len(sched.requests))))
    return launched, culprits
