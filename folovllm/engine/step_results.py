"""What a step's results do to the engine's requests, and how requests end.

The engine hands over each resolved step (``apply``): the speculator settles the rows that verified
proposals first (the prefix cache must never name a rejected token), then each request's full blocks are
named in the prefix cache, prompt logprobs are stored, pooling requests end with their result, and each
sampled token goes through the grammar, the output processor and the stop checks — one at a time, since a
verify row brings several. A request whose processing raises ends alone with finish_reason "error".

It also holds the requests the engine knows (``groups``, by user request id) and those ended since the
last launch (``finished_ids``: the worker frees their state with the next step).
"""
from __future__ import annotations

import logging
import time

from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.scheduler import Scheduler, SchedulerOutput
from folovllm.engine.output_processor import OutputProcessor, RequestGroup
from folovllm.engine.stats import EngineStats
from folovllm.engine.step_phases import PhaseClock
from folovllm.request import FINISHED_STATUSES, Request, RequestStatus
from folovllm.sample.prompt_logprobs import PromptLogprobsChunk
from folovllm.spec_decode.speculator import Speculator
from folovllm.structured_output import StructuredOutputManager
from folovllm.worker.step_input import StepOutput

logger = logging.getLogger(__name__)
RUNNING = RequestStatus.RUNNING

Touched = dict[str, RequestGroup]  # the groups a step changed, by request id: each gets an output


class StepResults:
    """The engine's requests and what happens to them after a step (see the module doc)."""

    def __init__(self, scheduler: Scheduler, kv_cache: KVCacheManager, structured: StructuredOutputManager,
                 output_processor: OutputProcessor, stats: EngineStats, speculator: Speculator | None,
                 phases: PhaseClock, batched: bool = True) -> None:
        """``batched``: a step's plain rows in bulk (``FOLOVLLM_BATCHED_OUTPUTS``), else every token one by one."""
        self.scheduler, self.kv_cache, self.structured = scheduler, kv_cache, structured
        self.output_processor, self.stats, self.speculator = output_processor, stats, speculator
        self.phases = phases
        self.batched = batched
        self.groups: dict[str, RequestGroup] = {}
        self.finished_ids: list[str] = []  # ended since the last launch

    def apply(self, sched: SchedulerOutput, sampled: list[Request], out: StepOutput, touched: Touched) -> None:
        """A resolved step's results: ``sampled`` lists the requests it sampled for, in row order."""
        now = time.perf_counter()
        if self.speculator is not None:  # first: the prefix cache must not name a rejected proposal
            self.speculator.settle(sched, sampled, out)
        self.kv_cache.cache_full_blocks(sched.requests)
        if out.prompt_logprobs:
            self._take_prompt_logprobs(sched, out.prompt_logprobs, touched)
        if out.pooled:
            self._take_pooled(sched, out.pooled, now, touched)
        self.phases.lap("output processing")
        if self.batched and not out.spec_token_ids:
            self._take_tokens(sampled, out, now, touched)
            return
        for row, request in enumerate(sampled):
            request.num_pending_tokens -= 1
            if request.status.finished:  # ended meanwhile (stopped one step earlier, or aborted)
                continue
            for token_id, token_logprobs in zip(*out.row_tokens(row)):  # several: it verified proposals
                if not self._take_token(request, token_id, token_logprobs, now, touched):
                    break
        self.phases.lap("output processing")

    def _take_tokens(self, sampled: list[Request], out: StepOutput, now: float, touched: Touched) -> None:
        """One token per row. Rows whose token needs nothing but the stop and length checks and the text (no
        grammar, logprobs or stop strings) are appended in one pass, stop-checked as one array and detokenized
        in one pass; the others go through ``_take_token`` one by one, in row order."""
        tokens, logprobs = out.sampled_token_ids, out.logprobs
        plain: list[Request] = []
        plain_tokens: list[int] = []
        at_length: list[int] = []  # plain rows at their length limit
        groups = self.groups
        for row, (request, token) in enumerate(zip(sampled, tokens)):
            request.num_pending_tokens -= 1
            status = request.status  # identity first: hashing an enum member is a Python call
            if status is not RUNNING and status in FINISHED_STATUSES:  # ended meanwhile (stopped one step
                continue  # earlier, or aborted)
            if not request.plain_outputs or request.grammar is not None:
                self._take_token(request, token, logprobs[row] if logprobs else None, now, touched)
                continue
            request.token_ids.append(token)
            output = request.output_token_ids
            output.append(token)
            if len(output) >= request.output_limit:
                at_length.append(len(plain))
            plain.append(request)
            plain_tokens.append(token)
            metrics = request.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now
            if not request.final_only:
                touched[request.parent_id] = groups[request.parent_id]
        if not plain:
            return
        self.stats.generation_tokens += len(plain)
        self.phases.lap("output processing")
        processor = self.output_processor
        stopped = processor.stop_token_rows(plain, plain_tokens)
        self.phases.lap("stop checks")
        for row, error in processor.detokenize(plain, plain_tokens, stopped):
            logger.error("output processing failed for request %s; ending it", plain[row].request_id, exc_info=error)
            self.fail_group(plain[row].parent_id, touched)
        self.phases.lap("detokenize")
        # a stop token ends its request once min_tokens is met (known tokens: a pending one is not judged yet)
        ends = [(row, RequestStatus.FINISHED_STOPPED) for row in stopped
                if len(plain[row].output_token_ids) >= plain[row].params.min_tokens]
        if at_length:
            ending = {row for row, _ in ends}
            ends = sorted(ends + [(row, RequestStatus.FINISHED_LENGTH) for row in at_length if row not in ending])
        for row, status in ends:  # in row order, as one by one: blocks go back to the pool in that order
            request = plain[row]
            if request.status in FINISHED_STATUSES:  # its text failed: ended already
                continue
            if status == RequestStatus.FINISHED_STOPPED:
                processor.stopped_by_token(request, plain_tokens[row])
            else:
                processor.flush_text(request)  # a character cut off by the length limit
            self._finish_plain(request, status, now, touched)
        self.phases.lap("stop checks")

    def _finish_plain(self, request: Request, status: RequestStatus, now: float, touched: Touched) -> None:
        request.metrics.finished_time = now
        self.finish(request, status)
        touched[request.parent_id] = self.groups[request.parent_id]

    def _take_token(self, request: Request, token_id: int, logprobs, now: float, touched: Touched) -> bool:
        """One sampled token through the grammar, output and stop checks; False once the request ended."""
        refused = self.structured.accept(request, token_id) if request.grammar is not None else None
        if refused is not None:
            logger.warning("request %s: %s", request.request_id, refused)
            self.fail_group(request.parent_id, touched, refused)
            return False
        try:
            status = self.output_processor.append_token(request, token_id, logprobs)
        except Exception:
            logger.exception("output processing failed for request %s; ending it", request.request_id)
            self.fail_group(request.parent_id, touched)
            return False
        if status is None and request.grammar is not None and request.grammar.is_terminated:
            status = RequestStatus.FINISHED_STOPPED  # a stop token ended the grammar (ignore_eos)
        if request.metrics.first_token_time is None:
            request.metrics.first_token_time = now
        request.metrics.last_token_time = now
        if status is not None:
            request.metrics.finished_time = now
            self.finish(request, status)
        self.stats.generation_tokens += 1
        touched[request.parent_id] = self.groups[request.parent_id]
        return status is None

    def _take_pooled(self, sched: SchedulerOutput, pooled: list[tuple[str, list]], now: float,
                     touched: Touched) -> None:
        """A pooling request whose prompt the step ended is done: its result is its output."""
        by_id = {request.request_id: request for request in sched.requests}
        for request_id, result in pooled:
            request = by_id[request_id]
            if request.status.finished:  # aborted meanwhile
                continue
            request.pooled = result
            request.metrics.first_token_time = request.metrics.last_token_time = now
            request.metrics.finished_time = now
            self.finish(request, RequestStatus.FINISHED_STOPPED)
            touched[request.parent_id] = self.groups[request.parent_id]

    def _take_prompt_logprobs(self, sched: SchedulerOutput, chunks: list[PromptLogprobsChunk],
                              touched: Touched) -> None:
        """Stores each chunk's prompt logprobs in its request, by position."""
        by_id = {request.request_id: request for request in sched.requests}
        for chunk in chunks:
            request = by_id[chunk.request_id]
            if request.status.finished:
                continue
            try:
                self.output_processor.add_prompt_logprobs(request, chunk.first_position, chunk.entries)
            except Exception:
                logger.exception("prompt logprobs failed for request %s; ending it", request.request_id)
                self.fail_group(request.parent_id, touched)

    def fail_group(self, request_id: str, touched: Touched, reason: str | None = None) -> None:
        """Ends every sample of a user request with FINISHED_ERROR; its output says "error"
        (and ``reason``, when given, as its stop_reason)."""
        group = self.groups.get(request_id)
        if group is None:
            return
        for sample in group.samples:
            if reason is not None and not sample.status.finished:
                sample.stop_reason = reason
            self.finish(sample, RequestStatus.FINISHED_ERROR)
        touched[request_id] = group

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Ends one request (once): the scheduler frees its blocks, the worker its state with the next step."""
        if request.status.finished:
            return
        self.stats.finished_by_reason[status.value] += 1
        self.finished_ids.append(request.request_id)
        if request.metrics.finished_time is None:
            request.metrics.finished_time = time.perf_counter()
        self.scheduler.finish_request(request, status)
        if self.speculator is not None:
            self.speculator.finished(request)
