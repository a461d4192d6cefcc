"""The engine's side of the worker boundary: a scheduler decision becomes the worker's plain ``StepInput``.

A request whose row samples with settings that stay the same is sent once in full with ``keep`` set: the
worker then keeps its block table, sampling row and adapter (worker/request_states.py). While it keeps them,
a step that computes just the request's next token sends a decode row instead: its id, token and position,
and the blocks its table gained, in columns (``DecodeRows``). ``StepInputBuilder`` mirrors which requests the
worker keeps; a finished or preempted request is forgotten and sent in full again should it run.
"""
from __future__ import annotations

import operator

from folovllm.core.scheduler import SchedulerOutput
from folovllm.request import Request
from folovllm.sample.prompt_logprobs import PromptLogprobsRequest
from folovllm.sample.rows import SamplingRow, keeps_settings
from folovllm.spec_decode.rows import draft_rows
from folovllm.structured_output import StructuredOutputManager
from folovllm.worker.step_input import DecodeRows, ScheduledRequest, StepInput

Entry = tuple[Request, int, list[int]]  # a scheduled request, its new tokens, its block table


class StepInputBuilder:
    """Builds each step's input; ``decode_rows`` False sends every request in full (``FOLOVLLM_DECODE_ROWS``)."""

    def __init__(self, structured: StructuredOutputManager | None, decode_rows: bool) -> None:
        self.structured = structured
        self.decode_rows = decode_rows
        self.kept: set[str] = set()  # the requests the worker keeps, as of the last launch

    def build(self, sched: SchedulerOutput, finished_request_ids: list[str]) -> tuple[StepInput, list[Request]]:
        """The step's input, and the requests that sample a token in it, in row order (its decode rows last)."""
        kept = self.kept
        kept.difference_update(finished_request_ids)  # the worker forgets them first; an id may come back
        kept.difference_update(r.request_id for r in sched.preempted)
        requests, decodes, start, bulk_ids = sched.requests, [], 0, None
        bulk = sched.num_bulk_decodes  # the scheduler's bulk decodes come first, one token each
        if bulk and kept:
            ids = list(map(_request_id, requests[:bulk]))
            if kept.issuperset(ids):  # all kept (the usual step): decode rows, without a look at each
                decodes, start, bulk_ids = requests[:bulk], bulk, ids
        entries: list[Entry] = list(zip(requests[start:], sched.num_new_tokens[start:], sched.block_tables[start:]))
        if kept:
            general: list[Entry] = []
            for entry in entries:
                if entry[1] == 1 and entry[0].request_id in kept:
                    decodes.append(entry[0])
                else:
                    general.append(entry)
            entries = general
        if any(map(_lora_request, requests)):  # an adapter is never falsy
            # one adapter's rows side by side: each adapted linear then works on slices of the batch
            entries.sort(key=lambda e: _lora_order(e[0]))
            decodes.sort(key=_lora_order)
            bulk_ids = None  # reordered
        scheduled, sampled = general_rows(entries, sched, self.structured, self.decode_rows)
        # the bulk decodes alone, in their order: their ids are known
        decode_ids = bulk_ids if bulk_ids is not None and len(decodes) == start else list(map(_request_id, decodes))
        step = StepInput(scheduled, finished_request_ids,
                         _decode_rows(decodes, decode_ids,
                                      {r: b for r, b in sched.new_block_ids.items() if r in kept})
                         if decodes else None)
        return step, sampled + decodes

    def launched(self, step: StepInput) -> None:
        """The worker took the step: it keeps the requests the step marked."""
        self.kept.update(r.request_id for r in step.requests if r.keep)


def build_step_input(sched: SchedulerOutput, finished_request_ids: list[str],
                     structured: StructuredOutputManager | None = None) -> tuple[StepInput, list[Request]]:
    """The step's input with every request in full, and the requests that sample a token in it, in row order.
    ``structured`` fills the token bitmask of the rows whose request has a structured-outputs constraint."""
    return StepInputBuilder(structured, decode_rows=False).build(sched, finished_request_ids)


def general_rows(entries: list[Entry], sched: SchedulerOutput, structured: StructuredOutputManager | None,
                 keep: bool) -> tuple[list[ScheduledRequest], list[Request]]:
    """Each entry in full, and the requests that sample, in order; ``keep``: mark the rows the worker may keep."""
    scheduled: list[ScheduledRequest] = []
    sampled: list[Request] = []
    rows: list[SamplingRow] = []
    for request, num_new, table in entries:
        start = request.num_computed_tokens
        end = start + num_new
        drafts = sched.draft_token_ids.get(request.request_id, [])  # proposals this step verifies
        known = request.token_ids[start:end] + drafts  # a token past these is still pending on the device
        sampling = None
        if request.pooling is not None:  # prefill only: its rows are pooled, nothing is sampled
            scheduled.append(ScheduledRequest(request.request_id, known, 0, start, table, pooling=request.pooling,
                                              pooling_done=end == request.num_prompt_tokens,
                                              lora=request.lora_request))
            continue
        later_rows = []
        if end - len(drafts) == request.num_tokens:  # caught up: this step's last logits give the next token
            sampling = sampling_row(request)
            sampled.append(request)
            rows.append(sampling)
            if drafts:
                bitmasks = structured.draft_bitmasks(request, drafts) if request.grammar is not None else None
                later_rows = draft_rows(sampling, drafts, bitmasks)
        scheduled.append(ScheduledRequest(
            request.request_id, known, num_new - len(known), start, table, sampling,
            prompt_logprobs_request(request, start, end), lora=request.lora_request, draft_token_ids=drafts,
            draft_rows=later_rows,
            keep=keep and sampling is not None and request.grammar is None and keeps_settings(sampling)))
    if structured is not None and any(r.grammar is not None for r in sampled):
        for row, bitmask in zip(rows, structured.fill_bitmasks(sampled)):
            row.allowed_token_bitmask = bitmask
    return scheduled, sampled


def _decode_rows(requests: list[Request], request_ids: list[str],
                 new_blocks: dict[str, tuple[int, list[int]]]) -> DecodeRows:
    """Kept requests (with their ids) that each compute their next token, as columns (a token still on the
    device: pending)."""
    pending = [row for row, count in enumerate(map(_pending_tokens, requests)) if count]
    tokens = [0 if r.num_pending_tokens else r.token_ids[-1] for r in requests] if pending \
        else [r.token_ids[-1] for r in requests]
    return DecodeRows(request_ids, tokens, list(map(_computed_tokens, requests)), pending, new_blocks)


_request_id = operator.attrgetter("request_id")
_lora_request = operator.attrgetter("lora_request")
_pending_tokens = operator.attrgetter("num_pending_tokens")
_computed_tokens = operator.attrgetter("num_computed_tokens")


def _lora_order(request: Request) -> int:
    return 0 if request.lora_request is None else request.lora_request.lora_int_id


def sampling_row(request: Request) -> SamplingRow:
    """The request's sampling settings; its earlier tokens only when a processor reads them
    (penalties: prompt and output; bad words: output)."""
    params = request.params
    if params.has_penalties:
        return SamplingRow(params, request.seed, request.num_output_tokens, request.stop_token_ids,
                           request.prompt_token_ids, request.output_token_ids, request.bad_words_token_ids)
    if request.bad_words_token_ids:
        return SamplingRow(params, request.seed, request.num_output_tokens, request.stop_token_ids,
                           output_token_ids=request.output_token_ids,
                           bad_words_token_ids=request.bad_words_token_ids)
    return SamplingRow(params, request.seed, request.num_output_tokens, request.stop_token_ids)


def prompt_logprobs_request(request: Request, start: int, end: int) -> PromptLogprobsRequest | None:
    """The prompt tokens that rows ``[start, end)`` predict (row ``p`` predicts token ``p + 1``),
    when the request asks for prompt logprobs and some of those are prompt tokens."""
    if not request.needs_prompt_logprobs:
        return None
    last = min(end, request.num_prompt_tokens - 1)  # the prompt's last row predicts an output token
    if last <= start:
        return None
    return PromptLogprobsRequest(request.params.prompt_logprobs, start + 1,
                                 request.prompt_token_ids[start + 1:last + 1])
