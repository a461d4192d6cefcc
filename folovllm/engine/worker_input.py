"""The engine's side of the worker boundary: a scheduler decision becomes the worker's plain ``StepInput``."""
from __future__ import annotations

from folovllm.core.scheduler import SchedulerOutput
from folovllm.request import Request
from folovllm.sample.prompt_logprobs import PromptLogprobsRequest
from folovllm.sample.rows import SamplingRow
from folovllm.spec_decode.rows import draft_rows
from folovllm.structured_output import StructuredOutputManager
from folovllm.worker.step_input import ScheduledRequest, StepInput


def build_step_input(sched: SchedulerOutput, finished_request_ids: list[str],
                     structured: StructuredOutputManager | None = None) -> tuple[StepInput, list[Request]]:
    """The step's input, and the requests that sample a token in it, in row order. ``structured``
    fills the token bitmask of the rows whose request has a structured-outputs constraint."""
    scheduled: list[ScheduledRequest] = []
    sampled: list[Request] = []
    rows: list[SamplingRow] = []
    entries = list(zip(sched.requests, sched.num_new_tokens, sched.block_tables))
    if any(request.lora_request is not None for request in sched.requests):
        # one adapter's rows side by side: each adapted linear then works on slices of the batch
        entries.sort(key=lambda e: 0 if e[0].lora_request is None else e[0].lora_request.lora_int_id)
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
        scheduled.append(ScheduledRequest(request.request_id, known, num_new - len(known), start, table,
                                          sampling, prompt_logprobs_request(request, start, end),
                                          lora=request.lora_request, draft_token_ids=drafts, draft_rows=later_rows))
    if structured is not None and any(r.grammar is not None for r in sampled):
        for row, bitmask in zip(rows, structured.fill_bitmasks(sampled)):
            row.allowed_token_bitmask = bitmask
    return StepInput(scheduled, finished_request_ids), sampled


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
