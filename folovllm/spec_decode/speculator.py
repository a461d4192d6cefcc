"""The engine's side of speculative decoding: proposals before each schedule, and after each step the
KV rolled back past the rejected proposals and the acceptance counted.

The scheduler gives a request with proposals ``1 + k`` tokens (its budget counts them); the runner
scores every proposal in the same ragged batch as prefill chunks and plain decodes; a step then
emits ``a + 1`` tokens for ``a`` kept proposals, and ``num_computed_tokens`` moves back over the
``k - a`` rejected ones, whose slots the next step overwrites (their blocks stay in the table and are
reused, or are freed with the request). Prefix-cache hashes cover computed, known tokens only, so
they never name a proposal.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from folovllm.config import EngineConfig
from folovllm.core.scheduler import SchedulerOutput
from folovllm.engine.stats import EngineStats
from folovllm.model.loader.hub import resolve_model_files
from folovllm.request import Request
from folovllm.spec_decode.config import SpeculativeConfig
from folovllm.spec_decode.draft import DraftModelProposer
from folovllm.spec_decode.ngram import propose_ngram
from folovllm.structured_output import StructuredOutputManager
from folovllm.worker.step_input import StepOutput

logger = logging.getLogger(__name__)
LOG_INTERVAL_S = 10.0  # how often the acceptance rate is logged while requests speculate


def make_speculator(config: EngineConfig, structured: StructuredOutputManager, stats: EngineStats,
                    vocab_size: int, max_model_len: int) -> Speculator | None:
    """The engine's speculator for its resolved ``config`` (None: no speculative_config)."""
    if config.speculative_config is None:
        return None
    spec = SpeculativeConfig.from_dict(config.speculative_config)
    draft = None
    if spec.method == "draft_model":
        draft_path = resolve_model_files(dataclasses.replace(config, model=spec.model, tokenizer=None)).model
        draft = DraftModelProposer(config, draft_path, vocab_size, max_model_len)
    return Speculator(spec, structured, stats, draft)


class Speculator:
    """Proposes for the running requests (n-gram lookup over prompt and output, or a draft model) and
    settles each step."""

    def __init__(self, config: SpeculativeConfig, structured: StructuredOutputManager, stats: EngineStats,
                 draft: DraftModelProposer | None = None) -> None:
        self.config = config
        self.draft = draft
        self.structured = structured
        self.stats = stats
        stats.spec_decode_num_accepted_tokens_per_pos = [0] * config.num_speculative_tokens
        self._logged = (time.perf_counter(), 0, 0, 0)  # when, drafts, draft tokens, accepted then

    def propose(self, running: list[Request]) -> None:
        """Sets every running request's proposals for the next schedule (none above
        ``disable_by_batch_size`` running requests, or for a request that is not decoding)."""
        limit = self.config.disable_by_batch_size
        enabled = limit is None or len(running) <= limit
        config = self.config
        for request in running:
            request.spec_token_ids = []
        decoding = [request for request in running if enabled and _decoding(request)]
        if self.draft is not None:
            self.draft.keep_only({request.request_id for request in running})  # preempted ones start over
            proposals = self.draft.propose(decoding, config.num_speculative_tokens) if decoding else []
        else:
            proposals = [propose_ngram(request.token_ids, config.num_speculative_tokens, config.prompt_lookup_min,
                                       config.prompt_lookup_max) for request in decoding]
        for request, drafts in zip(decoding, proposals):
            if drafts and request.grammar is not None:  # a proposal the grammar refuses is cut
                drafts = self.structured.fitting_prefix(request, drafts)
            request.spec_token_ids = drafts

    def finished(self, request: Request) -> None:
        """A request ended: the draft model's blocks for it are freed now."""
        if self.draft is not None:
            self.draft.forget(request.request_id)

    def settle(self, sched: SchedulerOutput, sampled: list[Request], out: StepOutput) -> None:
        """Moves each speculating request's ``num_computed_tokens`` back over its rejected proposals
        (before the prefix cache names any block) and counts drafts and acceptances."""
        if not sched.draft_token_ids:
            return
        stats = self.stats
        for row, request in enumerate(sampled):
            drafts = sched.draft_token_ids.get(request.request_id)
            if not drafts:
                continue
            num_accepted = len(out.spec_token_ids[row]) - 1
            request.num_computed_tokens -= len(drafts) - num_accepted
            stats.spec_decode_num_drafts += 1
            stats.spec_decode_num_draft_tokens += len(drafts)
            stats.spec_decode_num_accepted_tokens += num_accepted
            for position in range(num_accepted):
                stats.spec_decode_num_accepted_tokens_per_pos[position] += 1
        self._log_acceptance()

    def _log_acceptance(self) -> None:
        stats = self.stats
        now = time.perf_counter()
        then, drafts, draft_tokens, accepted = self._logged
        if now - then < LOG_INTERVAL_S or stats.spec_decode_num_drafts == drafts:
            return
        new_drafts = stats.spec_decode_num_drafts - drafts
        new_tokens = stats.spec_decode_num_draft_tokens - draft_tokens
        new_accepted = stats.spec_decode_num_accepted_tokens - accepted
        logger.info("speculative decoding: acceptance rate %.1f%%, mean acceptance length %.2f "
                    "(%d drafts, %d proposed, %d accepted in %.0f s)", 100.0 * new_accepted / max(new_tokens, 1),
                    1.0 + new_accepted / new_drafts, new_drafts, new_tokens, new_accepted, now - then)
        self._logged = (now, stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens,
                        stats.spec_decode_num_accepted_tokens)


def _decoding(request: Request) -> bool:
    """Its cache holds every token but the last, none pending: the next step is a decode."""
    return (request.num_output_tokens > 0 and request.num_pending_tokens == 0 and request.pooling is None
            and request.num_computed_tokens == request.num_tokens - 1)
