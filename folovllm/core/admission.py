"""Admission modes: when may a waiting request join the running batch (the three schools).

- ``on-demand`` (vLLM): admit while blocks are free; blocks come as tokens arrive; on shortage
  preempt (recompute later).
- ``reserve`` (TGI): admit only if ``prompt + max_tokens`` of every running request plus the new one
  fit ``max_batch_total_tokens``; whole prompts, at most ``max_batch_prefill_tokens`` per step, in
  steps that pause decoding; ``waiting_served_ratio`` / ``max_waiting_tokens`` decide when such a
  prefill step is worth it. Never preempts.
- ``adaptive`` (SGLang): reserve ``prompt + beta * max_tokens``; beta follows how much of
  ``max_tokens`` requests really use (bounded), and grows after a shortage; on shortage retract the
  request that loses the least work (fewest outputs) and frees the most (longest prompt).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from folovllm.config import EngineConfig
from folovllm.paging import blocks_for_tokens
from folovllm.registry import Registry
from folovllm.request import Request

logger = logging.getLogger(__name__)

ADMISSION_MODES: Registry[type[OnDemandAdmission]] = Registry("admission mode")


@dataclass
class StepPlan:
    run_running: bool = True  # serve the running requests this step
    admit: bool = True  # admit waiting requests this step
    max_prefill_tokens: int | None = None  # cap on admitted prompt tokens this step


@ADMISSION_MODES.register("on-demand")
class OnDemandAdmission:
    name = "on-demand"
    preempts = True
    chunked_admission = True  # a newly admitted prompt may be cut into chunks
    victim_order_changes = False  # a running request's victim_key changes as it runs (re-sort every step)

    @classmethod
    def from_config(cls, config: EngineConfig, num_blocks: int,
                    max_num_batched_tokens: int) -> OnDemandAdmission:
        """Builds the mode from the engine's config, KV cache size and per-step token budget."""
        return cls()

    def plan_step(self, running: list[Request], waiting: list[Request]) -> StepPlan:
        return StepPlan()

    def check(self, request: Request, max_num_batched_tokens: int) -> None:
        """Raises ValueError for a request this mode could never admit."""

    def fits(self, request: Request, running: list[Request]) -> bool:
        return True

    def victim_key(self, request: Request) -> tuple | None:
        """None: the policy's order decides who is preempted."""
        return None

    def on_finished(self, request: Request) -> None:
        pass

    def on_preempted(self, request: Request) -> None:
        pass


@ADMISSION_MODES.register("reserve")
class ReserveAdmission(OnDemandAdmission):
    name = "reserve"
    preempts = False
    chunked_admission = False

    @classmethod
    def from_config(cls, config: EngineConfig, num_blocks: int,
                    max_num_batched_tokens: int) -> ReserveAdmission:
        total = config.max_batch_total_tokens or num_blocks * config.block_size
        prefill = config.max_batch_prefill_tokens or max_num_batched_tokens
        logger.info("reserve admission: max_batch_total_tokens=%d, max_batch_prefill_tokens=%d",
                    total, prefill)
        return cls(config.block_size, total, prefill, config.max_num_seqs,
                   config.waiting_served_ratio, config.max_waiting_tokens)

    def __init__(self, block_size: int, max_batch_total_tokens: int, max_batch_prefill_tokens: int,
                 max_num_seqs: int, waiting_served_ratio: float = 0.3, max_waiting_tokens: int = 20) -> None:
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_batch_total_tokens = max_batch_total_tokens
        self.max_batch_prefill_tokens = max_batch_prefill_tokens
        self.waiting_served_ratio = waiting_served_ratio
        self.max_waiting_tokens = max_waiting_tokens
        self.steps_since_prefill = 0

    def check(self, request: Request, max_num_batched_tokens: int) -> None:
        if self.reserved_tokens(request) > self.max_batch_total_tokens:
            raise ValueError(
                f"prompt ({request.num_prompt_tokens} tokens) + max_tokens ({request.max_tokens}) exceeds "
                f"max_batch_total_tokens={self.max_batch_total_tokens} of reserve admission")
        limit = min(self.max_batch_prefill_tokens, max_num_batched_tokens)
        if request.num_prompt_tokens > limit:
            raise ValueError(f"the prompt has {request.num_prompt_tokens} tokens; reserve admission "
                             f"prefills whole prompts of at most {limit} tokens")

    def reserved_tokens(self, request: Request) -> int:
        # Block-rounded, so reservations that fit can never run out of blocks.
        return blocks_for_tokens(request.num_prompt_tokens + request.max_tokens, self.block_size) * self.block_size

    def fits(self, request: Request, running: list[Request]) -> bool:
        total = sum(self.reserved_tokens(r) for r in running) + self.reserved_tokens(request)
        return total <= self.max_batch_total_tokens

    def plan_step(self, running: list[Request], waiting: list[Request]) -> StepPlan:
        if not running:
            return StepPlan(run_running=False, max_prefill_tokens=self.max_batch_prefill_tokens)
        admissible = self._count_admissible(running, waiting)
        forced = self.steps_since_prefill >= self.max_waiting_tokens
        needed = int(len(running) * self.waiting_served_ratio)
        if admissible > 0 and (forced or admissible >= needed):
            self.steps_since_prefill = 0
            return StepPlan(run_running=False, max_prefill_tokens=self.max_batch_prefill_tokens)
        self.steps_since_prefill += 1
        return StepPlan(admit=False)

    def _count_admissible(self, running: list[Request], waiting: list[Request]) -> int:
        """How many of the waiting requests (in order) one prefill step could take.

        Runs every step, so the reservation total is summed once and grown, not re-summed per candidate.
        """
        reserved = sum(self.reserved_tokens(r) for r in running)
        count = prefill = 0
        for request in waiting:
            prefill += request.num_tokens
            reserved += self.reserved_tokens(request)
            if (prefill > self.max_batch_prefill_tokens or len(running) + count >= self.max_num_seqs
                    or reserved > self.max_batch_total_tokens):
                break
            count += 1
        return count


@ADMISSION_MODES.register("adaptive")
class AdaptiveAdmission(OnDemandAdmission):
    name = "adaptive"
    victim_order_changes = True  # its victim key counts outputs

    @classmethod
    def from_config(cls, config: EngineConfig, num_blocks: int,
                    max_num_batched_tokens: int) -> AdaptiveAdmission:
        return cls(config.block_size, num_blocks, init_beta=config.adaptive_init_beta)

    def __init__(self, block_size: int, num_blocks: int, init_beta: float = 0.7,
                 min_beta: float = 0.1, max_beta: float = 1.0, retract_step: float = 0.1,
                 smoothing: float = 0.1) -> None:
        if not 0.0 <= min_beta <= init_beta <= max_beta <= 1.0:
            raise ValueError("adaptive admission needs 0 <= min_beta <= init_beta <= max_beta <= 1")
        self.block_size, self.num_blocks = block_size, num_blocks
        self.beta, self.min_beta, self.max_beta = init_beta, min_beta, max_beta
        self.retract_step, self.smoothing = retract_step, smoothing

    def reserved_blocks(self, request: Request) -> int:
        remaining = max(0, request.max_tokens - request.num_output_tokens)
        return blocks_for_tokens(int(request.num_tokens + self.beta * remaining), self.block_size)

    def fits(self, request: Request, running: list[Request]) -> bool:
        total = sum(self.reserved_blocks(r) for r in running) + self.reserved_blocks(request)
        return total <= self.num_blocks

    def victim_key(self, request: Request) -> tuple:
        # Preempted last-first: the most outputs (most work lost) are kept longest.
        return (-request.num_output_tokens, request.num_prompt_tokens)

    def on_finished(self, request: Request) -> None:
        if request.max_tokens > 0 and request.status.value != "abort":
            used = request.num_output_tokens / request.max_tokens
            beta = (1 - self.smoothing) * self.beta + self.smoothing * used
            self.beta = min(self.max_beta, max(self.min_beta, beta))

    def on_preempted(self, request: Request) -> None:
        self.beta = min(self.max_beta, self.beta + self.retract_step)


class StaticBatchAdmission(OnDemandAdmission):
    """Batch-level static batching, kept as an ablation to show what continuous batching gains: a
    batch is admitted only when the previous one has completely finished, so it waits for its
    slowest request. Built for ``scheduling="static"``, not registered as an admission mode."""

    name = "static"

    def plan_step(self, running: list[Request], waiting: list[Request]) -> StepPlan:
        return StepPlan(admit=not running)


def admission_mode_names() -> list[str]:
    """Names ``admission`` accepts."""
    return ADMISSION_MODES.names()


def make_admission(config: EngineConfig, num_blocks: int, max_num_batched_tokens: int) -> OnDemandAdmission:
    """The admission rule the config asks for; ValueError for an unknown mode or a bad combination."""
    if config.scheduling == "static":
        if config.admission != "on-demand":
            raise ValueError("scheduling=static is its own admission rule; use admission=on-demand")
        return StaticBatchAdmission()
    return ADMISSION_MODES.get(config.admission).from_config(config, num_blocks, max_num_batched_tokens)
