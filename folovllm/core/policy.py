"""Scheduling policies: in which order waiting requests are admitted, and who is preempted first.

Each policy only orders; the scheduler does the admitting (STYLE: policies, admission modes and KV
management are separate pieces that the scheduler composes).

- ``fcfs``: arrival order (vLLM's default).
- ``priority``: lower ``priority`` value first, ties by arrival (vLLM's semantics); the lowest
  priority running request is preempted first, and a better arrival may preempt a worse runner.
- ``sjf``: shortest expected job (prompt + max_tokens) first.
- ``fair``: tenants (the ``user`` field) share the tokens by virtual token counters: the tenant
  that has been served the fewest (weighted) tokens goes next, so a burst cannot starve others.

``sjf`` and ``fair`` age: a request that has waited ``max_queue_delay`` seconds jumps ahead of
every request that has not, in arrival order, so no request starves.
"""
from __future__ import annotations

from collections import defaultdict

from folovllm.registry import Registry
from folovllm.request import Request

POLICIES: Registry[type[SchedulingPolicy]] = Registry("scheduling policy")


@POLICIES.register("fcfs")
class SchedulingPolicy:
    """FCFS; the base of the others."""

    name = "fcfs"
    preempts_for_priority = False
    running_order_changes = False  # a running request's running_key changes as it runs (re-sort every step)

    def __init__(self, max_queue_delay: float | None = None) -> None:
        self.max_queue_delay = max_queue_delay

    @classmethod
    def from_options(cls, max_queue_delay: float | None,
                     weights: dict[str, float] | None) -> SchedulingPolicy:
        """Builds the policy from the engine's options (each policy takes those it uses)."""
        return cls(max_queue_delay)

    def waiting_key(self, request: Request, now: float) -> tuple:
        """Smaller goes first."""
        return (request.metrics.arrival_time, request.arrival_seq)

    def running_key(self, request: Request) -> tuple:
        """Running requests are served in this order; the last one is preempted first."""
        return (request.admission_seq,)

    def overdue(self, request: Request, now: float) -> bool:
        return (self.max_queue_delay is not None
                and now - request.metrics.arrival_time >= self.max_queue_delay)

    def on_arrival(self, request: Request) -> None:
        """Called when a request enters the waiting queue for the first time."""

    def on_scheduled(self, request: Request, num_tokens: int) -> None:
        """Called for every request a step runs, with the tokens it computes."""

    def on_decodes(self, requests: list[Request]) -> None:
        """``on_scheduled(request, 1)`` for each of ``requests``, in order (decodes scheduled in bulk)."""
        if type(self).on_scheduled is not SchedulingPolicy.on_scheduled:  # one that ignores them skips the loop
            for request in requests:
                self.on_scheduled(request, 1)

    def on_finished(self, request: Request) -> None:
        """Called once when a request finishes or is aborted."""


@POLICIES.register("priority")
class PriorityPolicy(SchedulingPolicy):
    name = "priority"
    preempts_for_priority = True

    def waiting_key(self, request: Request, now: float) -> tuple:
        return (request.priority, request.metrics.arrival_time, request.arrival_seq)

    def running_key(self, request: Request) -> tuple:
        return (request.priority, request.metrics.arrival_time, request.arrival_seq)


@POLICIES.register("sjf")
class ShortestJobFirstPolicy(SchedulingPolicy):
    name = "sjf"

    def waiting_key(self, request: Request, now: float) -> tuple:
        if self.overdue(request, now):
            return (0, request.metrics.arrival_time, request.arrival_seq)
        remaining = (request.num_tokens - request.num_computed_tokens
                     + request.max_tokens - request.num_output_tokens)
        return (1, remaining, request.metrics.arrival_time, request.arrival_seq)


@POLICIES.register("fair")
class FairSharePolicy(SchedulingPolicy):
    """Virtual token counters per tenant; a newcomer starts at the least-served active tenant's count."""

    name = "fair"

    def __init__(self, max_queue_delay: float | None = None,
                 weights: dict[str, float] | None = None) -> None:
        super().__init__(max_queue_delay)
        self.weights = weights or {}
        self.served: dict[str, float] = defaultdict(float)  # weighted tokens per tenant
        self.active: dict[str, int] = defaultdict(int)  # unfinished requests per tenant

    @classmethod
    def from_options(cls, max_queue_delay: float | None,
                     weights: dict[str, float] | None) -> FairSharePolicy:
        return cls(max_queue_delay, weights)

    def _tenant(self, request: Request) -> str:
        return request.user or ""

    def waiting_key(self, request: Request, now: float) -> tuple:
        if self.overdue(request, now):
            return (0, request.metrics.arrival_time, request.arrival_seq)
        return (1, self.served[self._tenant(request)], request.metrics.arrival_time, request.arrival_seq)

    def on_arrival(self, request: Request) -> None:
        tenant = self._tenant(request)
        if self.active[tenant] == 0:
            # No banking of credit while away: start level with the least-served active tenant.
            others = [self.served[t] for t, n in self.active.items() if n > 0 and t != tenant]
            if others:
                self.served[tenant] = max(self.served[tenant], min(others))
        self.active[tenant] += 1

    def on_finished(self, request: Request) -> None:
        self.active[self._tenant(request)] -= 1

    def on_scheduled(self, request: Request, num_tokens: int) -> None:
        self.served[self._tenant(request)] += num_tokens / self.weights.get(self._tenant(request), 1.0)


def policy_names() -> list[str]:
    """Names ``scheduling_policy`` accepts."""
    return POLICIES.names()


def make_policy(name: str, max_queue_delay: float | None = None,
                weights: dict[str, float] | None = None) -> SchedulingPolicy:
    """The policy registered as ``name``; ValueError listing the known names otherwise."""
    return POLICIES.get(name).from_options(max_queue_delay, weights)
