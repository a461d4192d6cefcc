"""A draft model's proposals: a smaller model of the same vocabulary, in this process on this device, with
its own worker and its own paged KV cache (a second block pool of the same kind).

Each step the draft catches up on a request's tokens it has not computed (the whole prompt the first
time; afterwards the tokens the target emitted), then decodes greedily ``k`` times. Its cache keeps the
tokens it computed; the next step keeps their longest common prefix with the request's tokens, so the
proposals the target rejected are overwritten. Greedy proposals are certain ones (a one-hot draft
distribution), which rejection sampling takes as they are.
"""
from __future__ import annotations

import dataclasses
import logging

from folovllm.config import EngineConfig
from folovllm.core.kv_cache import KVCacheManager
from folovllm.request import Request
from folovllm.sample.rows import SamplingRow
from folovllm.sampling_params import SamplingParams
from folovllm.worker.step_input import ScheduledRequest, StepInput
from folovllm.worker.worker import Worker

logger = logging.getLogger(__name__)
_GREEDY = SamplingRow(SamplingParams(temperature=0.0))


@dataclasses.dataclass
class _DraftSequence:
    """What the draft's block manager reads of a request."""

    request_id: str
    num_computed_tokens: int


class DraftModelProposer:
    """Proposes for a batch of decoding requests with one catch-up step and ``k - 1`` decode steps."""

    def __init__(self, config: EngineConfig, draft_path: str, vocab_size: int, max_model_len: int) -> None:
        """``config``: the target's resolved config; the draft runs with its device, dtype, backends and
        block size (no LoRA, no prefix caching)."""
        draft_config = dataclasses.replace(config, model=draft_path, hf_overrides=None, enable_lora=False,
                                           speculative_config=None, quantization="auto", tensor_parallel_size=1)
        self.worker = Worker(draft_config, draft_path)
        if self.worker.arch.vocab_size != vocab_size:
            raise ValueError(f"speculative_config: the draft model {draft_path!r} has a vocabulary of "
                             f"{self.worker.arch.vocab_size} tokens, the target {vocab_size}; they must match")
        self.max_model_len = min(max_model_len, self.worker.arch.max_position_embeddings)
        num_blocks = self.worker.determine_num_kv_blocks(self.max_model_len)
        self.kv_cache = KVCacheManager(num_blocks, config.block_size, enable_prefix_caching=False, model_key="draft")
        self.worker.initialize_cache(num_blocks, self.max_model_len)
        self.computed: dict[str, list[int]] = {}  # request id -> the tokens whose K/V the draft's cache holds

    def keep_only(self, request_ids: set[str]) -> None:
        """Frees the draft's blocks of every request not in ``request_ids`` (preempted, or ended)."""
        for request_id in [r for r in self.computed if r not in request_ids]:
            self.forget(request_id)

    def forget(self, request_id: str) -> None:
        """Frees the draft's blocks of one request."""
        self.kv_cache.free(_DraftSequence(request_id, 0))
        self.computed.pop(request_id, None)

    def propose(self, requests: list[Request], num_tokens: int) -> list[list[int]]:
        """Up to ``num_tokens`` greedy proposals per request (none where the draft's cache is full or the
        request is at the draft's length limit)."""
        rows: list[tuple[int, ScheduledRequest]] = []
        for index, request in enumerate(requests):
            tokens = request.token_ids
            held = self.computed.get(request.request_id, [])
            valid = _common_prefix(held, tokens, len(tokens) - 1)
            k = min(num_tokens, self.max_model_len - len(tokens))
            sequence = _DraftSequence(request.request_id, valid)
            if k < 1 or not self.kv_cache.allocate_slots(sequence, len(tokens) - valid + k - 1):
                continue
            self.computed[request.request_id] = list(tokens)
            rows.append((k, ScheduledRequest(request.request_id, tokens[valid:], 0, valid,
                                             list(self.kv_cache.block_table(request.request_id)), _GREEDY)))
        proposals: dict[str, list[int]] = {}
        while rows:
            out = self.worker.execute(StepInput([row for _, row in rows]))
            next_rows = []
            for (k, row), token in zip(rows, out.sampled_token_ids):
                drafted = proposals.setdefault(row.request_id, [])
                drafted.append(token)
                if len(drafted) < k:  # the proposal's K/V is computed by the next decode step
                    self.computed[row.request_id].append(token)
                    position = row.num_computed_tokens + len(row.new_token_ids)
                    next_rows.append((k, dataclasses.replace(row, new_token_ids=[token], num_computed_tokens=position)))
            rows = next_rows
        return [proposals.get(request.request_id, []) for request in requests]


def _common_prefix(held: list[int], tokens: list[int], limit: int) -> int:
    """How many leading tokens ``held`` and ``tokens`` share, at most ``limit``."""
    n = min(len(held), limit)
    for i in range(n):
        if held[i] != tokens[i]:
            return i
    return n
