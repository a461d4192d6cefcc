"""Counters the engine keeps as it steps; the server publishes them, the benchmarks trace them."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from folovllm.core.scheduler import SchedulerOutput, is_decode_row
from folovllm.kv_transfer.base import KVTransferResult
from folovllm.request import Request


@dataclass
class StepStats:
    """What one step did (one record of the step trace)."""

    time: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_preempted: int
    kv_blocks_used: int
    kv_usage: float
    # The step's shape for cost models (folovllm simulate calibrate); absent from older traces.
    num_scheduled: int = 0  # requests in the batch
    context_tokens: int = 0  # summed over the batch: tokens each request's attention reads (cached + new)
    prefill_cached_pairs: int = 0  # prefill chunks' new tokens × the tokens their request had computed before
    prefill_new_pairs: int = 0  # prefill chunks' causal pairs among their own new tokens, n·(n + 1) / 2 each
    duration_s: float = 0.0  # from the start of the engine step that scheduled it to its tokens being taken


@dataclass
class EngineStats:
    """Totals since start-up (Prometheus counters) plus the latest step (gauges)."""

    num_steps: int = 0
    prompt_tokens: int = 0  # prompt tokens computed (recomputation after preemption included)
    generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found cached
    finished_by_reason: Counter = field(default_factory=Counter)
    # PD disaggregation (kv_transfer/): prompt tokens of pulls ended, those whose KV arrived, pulls
    # done / failed, held KV handed out (or timed out)
    external_prefix_cache_queries: int = 0
    external_prompt_tokens: int = 0
    kv_transfer_loads: int = 0
    kv_transfer_load_failures: int = 0
    kv_transfer_sends: int = 0
    kv_transfer_recv_bytes: int = 0  # KV received by pulls that arrived
    kv_transfer_recv_seconds: float = 0.0  # their summed time, asked to in place
    # speculative decoding (vLLM's spec_decode_* counters): steps a request verified proposals in, the
    # proposals, those accepted, and those accepted at each proposal position
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    peak_num_running: int = 0
    host_time_s: float = 0.0  # CPU time in step() not spent waiting for the device (schedule, prepare, update)
    last_step: StepStats | None = None

    def record_step(self, step: StepStats, num_preempted: int, prefix_cache_queries: int,
                    prefix_cache_hits: int) -> None:
        """Adds a finished step to the totals and makes it the latest."""
        self.num_steps += 1
        self.prompt_tokens += step.num_prefill_tokens
        self.num_preemptions += num_preempted
        self.prefix_cache_queries, self.prefix_cache_hits = prefix_cache_queries, prefix_cache_hits
        self.peak_num_running = max(self.peak_num_running, step.num_running)
        self.last_step = step

    def record_kv_transfers(self, result: KVTransferResult, ended: list[Request]) -> None:
        """Counts the KV pulls and sends a step's transfers ended (``ended``: the waiting requests they were for)."""
        self.external_prefix_cache_queries += sum(r.num_prompt_tokens for r in ended)
        self.external_prompt_tokens += sum(r.num_external_computed_tokens for r in ended
                                           if r.request_id in result.finished_recving)
        self.kv_transfer_loads += len(result.finished_recving)
        self.kv_transfer_load_failures += len(result.failed_recving)
        self.kv_transfer_sends += len(result.finished_sending)
        self.kv_transfer_recv_bytes += result.recv_bytes
        self.kv_transfer_recv_seconds += result.recv_seconds

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


def context_tokens(sched: SchedulerOutput) -> int:
    """Tokens the step's attention reads, summed over its requests (computed + new), before it runs."""
    return sum(r.num_computed_tokens + n for r, n in zip(sched.requests, sched.num_new_tokens))


def prefill_cached_pairs(sched: SchedulerOutput) -> int:
    """(new prompt token, already computed token) pairs of the step's prefill chunks, before it runs:
    the attention of a prompt's new tokens over the prefix it found cached (or computed in an earlier
    chunk). Decode rows are left out; ``context_tokens`` covers them."""
    return sum(n * r.num_computed_tokens for r, n in zip(sched.requests, sched.num_new_tokens)
               if not is_decode_row(r, n))


def prefill_new_pairs(sched: SchedulerOutput) -> int:
    """(new prompt token, new prompt token) causal pairs of the step's prefill chunks: each chunk's
    attention over itself, n·(n + 1) / 2 for a chunk of n tokens. It grows with the square of a chunk,
    so a step of a few long prompts attends over more pairs than one of many short ones."""
    return sum(n * (n + 1) // 2 for r, n in zip(sched.requests, sched.num_new_tokens) if not is_decode_row(r, n))


def step_cost_terms(sched: SchedulerOutput) -> tuple[int, int, tuple[int, int]]:
    """(decode tokens, ``context_tokens``, (``prefill_cached_pairs``, ``prefill_new_pairs``)) of the step,
    before it runs, in one pass over its requests (the engine records them every step); the decodes the scheduler
    took in bulk come counted."""
    bulk = sched.num_bulk_decodes
    num_decode, context, cached_pairs, new_pairs = bulk, sched.bulk_context_tokens, 0, 0
    for request, n in zip(sched.requests[bulk:], sched.num_new_tokens[bulk:]):
        computed = request.num_computed_tokens
        context += computed + n
        if is_decode_row(request, n):
            num_decode += n
        else:
            cached_pairs += n * computed
            new_pairs += n * (n + 1) // 2
    return num_decode, context, (cached_pairs, new_pairs)
