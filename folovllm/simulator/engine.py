"""One simulated replica: the real ``Scheduler`` and ``KVCacheManager`` stepped on a virtual clock.

A step is what ``LLMEngine.step`` does without overlap: schedule, advance ``num_computed_tokens``,
then, ``cost.step_time`` later, name the newly full blocks for the prefix cache, append one token to
every request that caught up, and end those that reached their length. The token is a constant id:
no model, no sampler, no detokenizer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from folovllm.config import EngineConfig
from folovllm.core.admission import make_admission
from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.policy import make_policy
from folovllm.core.scheduler import Scheduler, SchedulerLimits, SchedulerOutput
from folovllm.request import Request, RequestStatus
from folovllm.simulator.cost_model import CostModel, StepShape

OUTPUT_TOKEN = 0  # every simulated output token; greedy would repeat one prompt's outputs alike too


@dataclass
class StepRecord:
    """One simulated step, as the replay test and ``--trace`` see it."""

    start: float
    end: float
    scheduled: list[tuple[str, int]]  # (request id, new tokens) in batch order
    shape: StepShape


class SimEngine:
    """A replica: add requests, start a step at a time, finish it when the cost model says."""

    def __init__(self, config: EngineConfig, num_blocks: int, max_model_len: int, cost: CostModel,
                 name: str = "0", keep_steps: bool = False) -> None:
        if num_blocks * config.block_size < max_model_len:
            raise ValueError(f"{num_blocks} blocks of {config.block_size} tokens hold fewer than "
                             f"max_model_len={max_model_len}; give more blocks or lower max_model_len")
        self.name, self.cost, self.max_model_len = name, cost, max_model_len
        self.now = 0.0
        reserve = max_model_len if config.kv_layout == "contiguous" else 0
        self.kv_cache = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching, "sim", reserve)
        max_batched = config.max_num_batched_tokens
        if not config.enable_chunked_prefill:
            max_batched = max(max_batched, max_model_len)  # as the engine raises it
        self.scheduler = Scheduler(
            SchedulerLimits(max_batched, config.max_num_seqs, max_model_len, config.enable_chunked_prefill,
                            config.long_prefill_token_threshold),
            self.kv_cache, make_policy(config.scheduling_policy, config.max_queue_delay, config.tenant_weights),
            make_admission(config, num_blocks, max_batched), clock=self._clock)
        self.caching = config.enable_prefix_caching
        self.busy = False
        self.num_steps = 0
        self.busy_s = 0.0
        self.steps: list[StepRecord] | None = [] if keep_steps else None
        self._step: tuple[SchedulerOutput, list[Request], float] | None = None

    def _clock(self) -> float:
        return self.now

    @property
    def num_unfinished(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    def add(self, request: Request) -> None:
        """Queues a request (ValueError if the admission mode could never admit it)."""
        self.scheduler.check_admissible(request)
        request.metrics.queued_time = request.metrics.arrival_time
        self.scheduler.add_request(request)

    def start_step(self, now: float) -> float | None:
        """Schedules a step at ``now``; returns when it ends (None: nothing to run, the replica idles)."""
        self.now = now
        sched = self.scheduler.schedule()
        if sched.is_empty:
            self.busy = False
            return None
        prefill = decode = context = pairs = cached_pairs = new_pairs = 0
        sampled = []
        for request, num_new in zip(sched.requests, sched.num_new_tokens):
            computed = request.num_computed_tokens
            total = request.num_tokens
            if num_new == 1 and computed == total - 1 and request.output_token_ids:
                decode += 1
            else:
                prefill += num_new
                cached_pairs += num_new * computed
                new_pairs += num_new * (num_new + 1) // 2
            context += computed + num_new
            pairs += num_new * computed + num_new * (num_new + 1) // 2
            request.num_computed_tokens = computed + num_new
            if computed + num_new == total:
                sampled.append(request)
        shape = StepShape(prefill, decode, context, len(sched.requests), pairs, len(sampled), cached_pairs,
                          new_pairs)
        end = now + self.cost.step_time(shape)
        if self.steps is not None:
            self.steps.append(StepRecord(now, end, [(r.request_id, n) for r, n in
                                                    zip(sched.requests, sched.num_new_tokens)], shape))
        self._step = (sched, sampled, now)
        self.busy = True
        return end

    def finish_step(self, now: float, on_token: Callable[[Request, float], None],
                    on_finished: Callable[[Request, float], None]) -> None:
        """Ends the running step at ``now``: prefix-cache naming, one token per caught-up request, ends."""
        assert self._step is not None, "finish_step without a started step"
        sched, sampled, started = self._step
        self._step = None
        self.now = now
        self.num_steps += 1
        self.busy_s += now - started
        if self.caching:
            cache = self.kv_cache.cache_computed_blocks
            for request in sched.requests:
                cache(request)
        max_len = self.max_model_len
        for request in sampled:
            if request.status.finished:
                continue
            request.token_ids.append(OUTPUT_TOKEN)
            request.output_token_ids.append(OUTPUT_TOKEN)
            on_token(request, now)
            if len(request.output_token_ids) >= request.max_tokens or len(request.token_ids) >= max_len:
                request.metrics.finished_time = now
                self.scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
                on_finished(request, now)
