"""Iteration-level scheduler: decides, for ONE step, which requests run and how many tokens each.

vLLM v1 style: there is no prefill phase. A request only tracks ``num_computed_tokens`` and
catches up to ``num_tokens``; a decoding request needs 1 token, an unfinished prompt takes a
chunk of what is left of the step's token budget (chunked prefill). Running requests go first,
then waiting ones are admitted in the policy's order, starting after their prefix-cache hits.
When blocks run out, the running request the policy ranks last is preempted: its blocks are
freed and it recomputes later. The policy (core/policy.py) orders; the admission mode
(core/admission.py) says whether a request may join; the KV cache manager owns the blocks.
"""
from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from folovllm.core.admission import OnDemandAdmission
from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.policy import SchedulingPolicy
from folovllm.kv_transfer.base import KVConnectorBase, KVTransferResult
from folovllm.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """One step's plan: the requests to run, in batch order, and how many new tokens each."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)  # each request's, after allocation
    preempted: list[Request] = field(default_factory=list)
    # speculative decoding: request id -> the proposals its step verifies (after its last token)
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # request id -> (index in its block table, the blocks it got this step from there on)
    new_block_ids: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    # the first ``num_bulk_decodes`` requests are decode rows of one token each, scheduled in one pass, and the
    # tokens their attention reads, summed (the step's cost terms count them without looking at each)
    num_bulk_decodes: int = 0
    bulk_context_tokens: int = 0

    def add(self, request: Request, num_new_tokens: int, block_table: list[int]) -> None:
        if request.spec_token_ids:
            self.draft_token_ids[request.request_id] = list(request.spec_token_ids)
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
        bulk = self.num_bulk_decodes
        return bulk + sum(n for r, n in zip(self.requests[bulk:], self.num_new_tokens[bulk:]) if is_decode_row(r, n))


def is_decode_row(request: Request, num_new_tokens: int) -> bool:
    """Whether the request generates from a full cache (not a prompt chunk), before the step runs: its
    last token, plus the proposals it verifies when it speculates."""
    return (num_new_tokens == 1 + len(request.spec_token_ids) and request.num_output_tokens > 0
            and request.num_computed_tokens == request.num_tokens - 1)


_computed_tokens = operator.attrgetter("num_computed_tokens")


@dataclass
class SchedulerLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    # > 0: a prompt advances at most this many tokens per step, leaving budget for other requests
    # (vLLM's long_prefill_token_threshold), so short requests are not stuck behind a long prefill.
    long_prefill_token_threshold: int = 0
    max_loras: int = 0  # > 0: distinct LoRA adapters among the running requests at most (the worker's slots)


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv_cache: KVCacheManager,
                 policy: SchedulingPolicy | None = None, admission: OnDemandAdmission | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 connector: KVConnectorBase | None = None, bulk_decodes: bool = True) -> None:
        """``bulk_decodes``: the running requests that each compute just their next token are scheduled in one
        pass (``FOLOVLLM_BULK_DECODES``); else each through the general path."""
        self.limits = limits
        self.bulk_decodes = bulk_decodes
        self.connector = connector
        # blocks allocated, prompt KV on the way from another instance; out of `waiting` so others go on
        self.waiting_for_kv: dict[str, Request] = {}
        self.kv_cache = kv_cache
        self.policy = policy or SchedulingPolicy()
        self.admission = admission or OnDemandAdmission()
        self.clock = clock
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._running_order_stale = False  # `running` changed since it was last sorted
        self._arrivals = itertools.count()
        self._admissions = itertools.count()

    # -- queue management -------------------------------------------------------------------

    def check_admissible(self, request: Request) -> None:
        """Raises ValueError for a request the admission mode could never admit."""
        self.admission.check(request, self.limits.max_num_batched_tokens)

    def add_request(self, request: Request) -> None:
        request.arrival_seq = next(self._arrivals)
        self.waiting.append(request)
        self.policy.on_arrival(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.waiting_for_kv)

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Marks a request finished and returns its blocks to the pool (or, when the KV connector
        says so, holds them for another instance)."""
        if request.status.finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING_FOR_REMOTE_KV:
            del self.waiting_for_kv[request.request_id]
            self.connector.request_aborted_while_loading(request.request_id)
        else:
            self.waiting.remove(request)
        request.status = status
        hold, request.kv_transfer_params_out = False, None
        if self.connector is not None:
            hold, request.kv_transfer_params_out = self.connector.request_finished(
                request, self.kv_cache.block_table(request.request_id))
        if hold:
            self.kv_cache.hold(request, request.kv_transfer_params_out["remote_request_id"])
        else:
            self.kv_cache.free(request)
        self.policy.on_finished(request)
        self.admission.on_finished(request)

    def abort(self, request: Request) -> None:
        self.finish_request(request, RequestStatus.FINISHED_ABORTED)

    # -- the per-step decision ---------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        now = self.clock()
        self.waiting.sort(key=lambda r: self.policy.waiting_key(r, now))
        if self._running_order_stale or self.policy.running_order_changes or self.admission.victim_order_changes:
            self.running.sort(key=self._running_key)  # keys that never change: only after it changed
            self._running_order_stale = False
        plan = self.admission.plan_step(self.running, self.waiting)
        if self.policy.preempts_for_priority and plan.admit:
            self._preempt_for_better_arrivals(out)
        budget = self.limits.max_num_batched_tokens
        shortage = False

        index = 0
        if self.bulk_decodes and plan.run_running:
            index = self._schedule_decodes(out, budget)
            budget -= index
        running, tables = self.running, self.kv_cache.block_tables  # every running request, every step: locals
        allocate, on_scheduled = self.kv_cache.allocate_slots, self.policy.on_scheduled
        while plan.run_running and index < len(running) and budget > 0:
            request = running[index]
            num_new = self._num_new_tokens(request, budget)
            if num_new == 0:
                index += 1
                continue
            if not allocate(request, num_new):
                ok, shortage_here = self._allocate_or_preempt(request, num_new, out)
                shortage = shortage or shortage_here
                if not ok:
                    break  # the request preempted itself: nothing later in `running` is left
            out.add(request, num_new, tables[request.request_id])
            on_scheduled(request, num_new)
            budget -= num_new
            index += 1

        # Admitting right after a shortage would thrash: the freed blocks go to running requests.
        prefill_left = plan.max_prefill_tokens
        index = 0  # the first waiting request not passed over (a grammar still compiling)
        while plan.admit and index < len(self.waiting) and not shortage and budget > 0 \
                and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[index]
            if not request.is_ready or not self._lora_fits(request):  # waits; those behind it may go
                index += 1
                continue
            if not self.admission.fits(request, self.running):
                break
            # Cached tokens are never run through the model: no prompt logprobs, no rows to pool.
            # A request whose KV arrived from another instance already holds its blocks.
            cached_blocks = [] if request.reads_every_prompt_row or request.num_computed_tokens > 0 \
                else self.kv_cache.find_cached_prefix(request)
            num_cached = len(cached_blocks) * self.kv_cache.block_size
            if self.connector is not None and request.num_computed_tokens == 0:
                num_external, load_async = self.connector.get_num_new_matched_tokens(request, num_cached)
                if num_external > 0 and load_async:
                    if not self._start_remote_load(request, cached_blocks, num_cached, num_external):
                        break
                    continue  # it waits off the queue; the next waiting request is at `index` now
            num_new = self._num_new_tokens(request, budget, num_cached,
                                           chunked=self.admission.chunked_admission)
            if prefill_left is not None and num_new > prefill_left:
                break
            if num_new == 0 or not self.kv_cache.allocate_slots(request, num_new, cached_blocks):
                break
            self._admit(request, num_cached)
            out.add(request, num_new, self.kv_cache.block_table(request.request_id))
            self.policy.on_scheduled(request, num_new)
            budget -= num_new
            if prefill_left is not None:
                prefill_left -= num_new
        out.new_block_ids = self.kv_cache.take_new_blocks()
        return out

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> int:
        """Schedules the running requests, from the first on, that each compute just their next known token (no
        proposals, under their limits), as the general path would, in one pass: one whose blocks hold the token
        makes no allocation call. Stops at the first that is not such a decode or finds no block (the general
        path takes it, preempting if need be, and the rest of ``running``). Returns how many it scheduled."""
        max_len = self.limits.max_model_len
        decodes: list[Request] = []
        for request in itertools.islice(self.running, budget):
            pending = request.num_pending_tokens
            num_tokens = len(request.token_ids) + pending
            if num_tokens - request.num_computed_tokens != 1 or request.spec_token_ids or num_tokens >= max_len \
                    or not 0 < len(request.output_token_ids) + pending < request.max_tokens:
                break
            decodes.append(request)
        tables = self.kv_cache.decode_tables(decodes)
        count = len(tables)
        if count < len(decodes):
            del decodes[count:]
        out.requests += decodes
        out.num_new_tokens += [1] * count
        out.block_tables += tables
        out.num_bulk_decodes = count
        out.bulk_context_tokens = sum(map(_computed_tokens, decodes)) + count
        self.policy.on_decodes(decodes)
        return count

    def _lora_fits(self, request: Request) -> bool:
        """Whether the request's adapter is running already or a slot is left for it."""
        lora = request.lora_request
        if lora is None or not self.limits.max_loras:
            return True
        running = {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}
        return lora.lora_int_id in running or len(running) < self.limits.max_loras

    def lora_adapters(self) -> tuple[list[str], list[str]]:
        """The adapter names of the waiting and of the running requests (each once, sorted)."""
        def names(requests: list[Request]) -> list[str]:
            return sorted({r.lora_request.lora_name for r in requests if r.lora_request is not None})
        return names(self.waiting), names(self.running)

    def _admit(self, request: Request, num_cached: int) -> None:
        self.waiting.remove(request)
        if request.num_computed_tokens == 0:  # else its KV came from another instance (counted then)
            self.kv_cache.record_prefix_query(request.num_tokens, num_cached)
            request.num_computed_tokens = num_cached
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_cached
        request.status = RequestStatus.RUNNING
        request.admission_seq = next(self._admissions)
        self.running.append(request)
        self._running_order_stale = True
        if request.metrics.first_scheduled_time is None:
            request.metrics.first_scheduled_time = self.clock()

    # -- KV from another instance (kv_transfer/) ------------------------------------------------

    def _start_remote_load(self, request: Request, cached_blocks: list[int], num_cached: int,
                           num_external: int) -> bool:
        """Allocates blocks for the request's local hits and its external tokens, and parks it in
        WAITING_FOR_REMOTE_KV while they arrive. False, with nothing changed, if blocks run out."""
        if not self.kv_cache.allocate_slots(request, num_external, cached_blocks):
            return False
        self.waiting.remove(request)
        self.kv_cache.record_prefix_query(request.num_tokens, num_cached)
        request.num_cached_tokens = num_cached
        request.num_external_computed_tokens = num_external
        request.status = RequestStatus.WAITING_FOR_REMOTE_KV
        self.waiting_for_kv[request.request_id] = request
        self.connector.update_state_after_alloc(request, self.kv_cache.block_table(request.request_id),
                                                num_cached, num_external)
        return True

    def update_from_kv_transfers(self, result: KVTransferResult) -> None:
        """Applies the transfers the worker reports ended: arrived KV makes its request schedulable
        (its blocks are named for the prefix cache only now); a failed pull recomputes locally;
        a finished send frees the held blocks."""
        for request_id in result.finished_recving | result.failed_recving:
            request = self.waiting_for_kv.pop(request_id, None)
            if request is None:
                continue  # aborted meanwhile: its blocks are already free
            if request_id in result.failed_recving:
                self.kv_cache.free(request)
                request.num_external_computed_tokens = 0
            else:
                request.num_computed_tokens = request.num_cached_tokens + request.num_external_computed_tokens
                self.kv_cache.cache_computed_blocks(request)
            request.status = RequestStatus.WAITING
            self.waiting.insert(0, request)
        for transfer_id in result.finished_sending:
            self.kv_cache.release_held(transfer_id)

    def _running_key(self, request: Request) -> tuple:
        key = self.admission.victim_key(request)
        return key if key is not None else self.policy.running_key(request)

    def _num_new_tokens(self, request: Request, budget: int, num_cached: int = 0,
                        chunked: bool = True) -> int:
        pending = request.num_pending_tokens  # num_tokens and num_output_tokens without the properties
        num_tokens = len(request.token_ids) + pending
        if len(request.output_token_ids) + pending >= request.max_tokens or num_tokens >= self.limits.max_model_len:
            return 0  # overlap: its last token is still pending and will end it by length
        num_new = num_tokens - request.num_computed_tokens - num_cached
        if num_new == 1 and not request.spec_token_ids:  # a decode
            return 1
        if num_new == 1 and request.spec_token_ids:  # its proposals, as far as budget and limits allow
            room = min(budget, self.limits.max_model_len - request.num_tokens,
                       request.max_tokens - request.num_output_tokens) - 1
            del request.spec_token_ids[max(room, 0):]
            return 1 + len(request.spec_token_ids)
        threshold = self.limits.long_prefill_token_threshold
        if chunked and self.limits.enable_chunked_prefill and 0 < threshold < num_new:
            num_new = threshold
        if num_new > budget:
            # Without chunking a prompt must fit whole into one step.
            num_new = budget if chunked and self.limits.enable_chunked_prefill else 0
        return num_new

    def _allocate_or_preempt(self, request: Request, num_new: int,
                             out: SchedulerOutput) -> tuple[bool, bool]:
        """Allocates blocks for ``request``, preempting from the back of ``running`` on shortage.

        Returns (allocated, there was a shortage).
        """
        shortage = False
        while not self.kv_cache.allocate_slots(request, num_new):
            if not self.admission.preempts:
                raise RuntimeError(f"{self.admission.name} admission ran out of KV blocks; "
                                   "its reservations should make that impossible")
            shortage = True
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is request:
                return False, shortage
        return True, shortage

    def _preempt_for_better_arrivals(self, out: SchedulerOutput) -> None:
        """Priority: waiting requests that outrank running ones take their places when needed."""
        free_blocks, free_seqs = self.kv_cache.num_free_blocks, self.limits.max_num_seqs - len(self.running)
        for candidate in [r for r in self.waiting if r.is_ready]:
            needed = self.kv_cache.blocks_for_tokens(candidate.num_tokens)
            while (free_seqs < 1 or needed > free_blocks) and self.running \
                    and self._running_key(self.running[-1]) > self._running_key(candidate):
                victim = self.running[-1]
                free_blocks += len(self.kv_cache.block_table(victim.request_id))
                free_seqs += 1
                self._preempt(victim, out)
            if free_seqs < 1 or needed > free_blocks:
                break
            free_blocks, free_seqs = free_blocks - needed, free_seqs - 1
        if out.preempted:
            now = self.clock()
            self.waiting.sort(key=lambda r: self.policy.waiting_key(r, now))

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        self.kv_cache.free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.waiting.insert(0, request)
        self.num_preemptions += 1
        self.admission.on_preempted(request)
        out.preempted.append(request)
