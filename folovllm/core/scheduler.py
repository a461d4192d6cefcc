"""Iteration-level scheduler: decides, for ONE step, which requests run and how many tokens each.

vLLM v1 style: there is no prefill phase. A request only tracks ``num_computed_tokens`` and
catches up to ``num_tokens``; a decoding request needs 1 token, an unfinished prompt takes a
chunk of what is left of the step's token budget (chunked prefill). Running requests go first,
then waiting ones are admitted in arrival order, starting after their prefix-cache hits. When blocks run out, the most recently admitted
running request is preempted: its blocks are freed and it recomputes later.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from folovllm.core.kv_cache import KVCacheManager
from folovllm.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """One step's plan: the requests to run, in batch order, and how many new tokens each."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)  # each request's, after allocation
    preempted: list[Request] = field(default_factory=list)

    def add(self, request: Request, num_new_tokens: int, block_table: list[int]) -> None:
        self.requests.append(request)
        self.num_new_tokens.append(num_new_tokens)
        self.block_tables.append(block_table)

    @property
    def total_num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.requests

    def num_decode_tokens(self) -> int:
        return sum(1 for r, n in zip(self.requests, self.num_new_tokens)
                   if n == 1 and r.num_output_tokens > 0 and r.num_computed_tokens == r.num_tokens - 1)


@dataclass
class SchedulerLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool = True


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv_cache: KVCacheManager) -> None:
        self.limits = limits
        self.kv_cache = kv_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Marks a request finished and returns its blocks to the pool."""
        if request.status.finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self.kv_cache.free(request)

    # -- the per-step decision ---------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.limits.max_num_batched_tokens

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = self._num_new_tokens(request, budget)
            if num_new == 0:
                index += 1
                continue
            if not self._allocate_or_preempt(request, num_new, out):
                break  # the request preempted itself: nothing later in `running` is left
            out.add(request, num_new, self.kv_cache.block_table(request.request_id))
            budget -= num_new
            index += 1

        # Admitting while we just preempted would thrash: the freed blocks go to running requests.
        while self.waiting and not out.preempted and budget > 0 \
                and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            cached_blocks = self.kv_cache.find_cached_prefix(request)
            num_cached = len(cached_blocks) * self.kv_cache.block_size
            num_new = self._num_new_tokens(request, budget, num_cached)
            if num_new == 0 or not self.kv_cache.allocate_slots(request, num_new, cached_blocks):
                break
            self.waiting.popleft()
            self.kv_cache.record_prefix_query(request.num_tokens, num_cached)
            request.num_computed_tokens = num_cached
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = time.perf_counter()
            out.add(request, num_new, self.kv_cache.block_table(request.request_id))
            budget -= num_new
        return out

    def _num_new_tokens(self, request: Request, budget: int, num_cached: int = 0) -> int:
        num_new = request.num_tokens - request.num_computed_tokens - num_cached
        if num_new > budget:
            # Without chunking a prompt must fit whole into one step.
            num_new = budget if self.limits.enable_chunked_prefill else 0
        return num_new

    def _allocate_or_preempt(self, request: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Allocates blocks for ``request``, preempting from the back of ``running`` on shortage."""
        while not self.kv_cache.allocate_slots(request, num_new):
            victim = self.running[-1]
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv_cache.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def abort(self, request: Request) -> None:
        self.finish_request(request, RequestStatus.FINISHED_ABORTED)
