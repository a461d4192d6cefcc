"""One step's model inputs as tensors: every scheduled token end to end, no padding, and the rows sampled."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.platforms import to_device
from folovllm.pooling.pooler import PoolingChunk
from folovllm.sample.prompt_logprobs import PromptLogprobsBatch
from folovllm.sample.sampler import SamplingRow
from folovllm.worker.step_input import StepInput


@dataclass
class StepBatch:
    """The model inputs of one step: every scheduled token end to end, no padding."""

    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor  # rows of the hidden states whose next token is sampled
    sampling_rows: list[SamplingRow]  # the settings of those rows, in order
    sampling_request_ids: list[str]  # the requests they belong to
    # Rows whose input token is still pending on the device (overlap): (row, request id).
    pending_inputs: list[tuple[int, str]] = field(default_factory=list)
    prompt_logprobs: PromptLogprobsBatch | None = None  # prefill rows whose next prompt token is scored
    pooling: list[PoolingChunk] = field(default_factory=list)  # the rows of pooling requests
    # speculative decoding: each sampling request's proposals (its rows: one more than those); empty
    # when no request proposes
    draft_token_ids: list[list[int]] = field(default_factory=list)


def prepare_step_batch(step: StepInput, block_size: int, device: torch.device) -> StepBatch:
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    query_lens: list[int] = []
    block_tables: list[list[int]] = []
    logits_indices: list[int] = []
    sampling_rows: list[SamplingRow] = []
    sampling_request_ids: list[str] = []
    pending_inputs: list[tuple[int, str]] = []
    prompt_logprobs = PromptLogprobsBatch([], [], [], [])
    pooling: list[PoolingChunk] = []
    draft_token_ids: list[list[int]] = []
    for request in step.requests:
        if request.pooling is not None:
            pooling.append(PoolingChunk(request.request_id, len(input_ids), request.num_new_tokens,
                                        request.num_computed_tokens, request.pooling, request.pooling_done))
        if request.prompt_logprobs is not None:  # the chunk's first rows predict the next prompt tokens
            first_row = len(input_ids)
            prompt_logprobs.request_ids.append(request.request_id)
            prompt_logprobs.requests.append(request.prompt_logprobs)
            prompt_logprobs.row_indices.extend(range(first_row, first_row + len(
                request.prompt_logprobs.target_token_ids)))
            prompt_logprobs.target_token_ids.extend(request.prompt_logprobs.target_token_ids)
        input_ids.extend(request.new_token_ids)
        for _ in range(request.num_pending_tokens):  # not known yet: on the device
            pending_inputs.append((len(input_ids), request.request_id))
            input_ids.append(0)
        num_new, table = request.num_new_tokens, request.block_table
        start = request.num_computed_tokens
        end = start + num_new
        positions.extend(range(start, end))
        slot_mapping.extend(table[pos // block_size] * block_size + pos % block_size
                            for pos in range(start, end))
        # A row verifying proposals attends as one decode row per token (causal by its seq_len): the
        # decode kernels' arithmetic, so its tokens are bit for bit those of one-token steps.
        for query_end in (range(start + 1, end + 1) if request.draft_token_ids else (end,)):
            query_len = query_end - (query_end - 1 if request.draft_token_ids else start)
            query_start_loc.append(query_start_loc[-1] + query_len)
            query_lens.append(query_len)
            seq_lens.append(query_end)
            block_tables.append(table)
        if request.sampling is not None:  # caught up: this step's last logits give the next token
            num_drafts = len(request.draft_token_ids)  # and with proposals, the rows scoring each of them
            logits_indices.extend(range(query_start_loc[-1] - 1 - num_drafts, query_start_loc[-1]))
            sampling_rows.append(request.sampling)
            sampling_rows.extend(request.draft_rows)
            sampling_request_ids.append(request.request_id)
            draft_token_ids.append(request.draft_token_ids)

    max_blocks = max(len(t) for t in block_tables)
    tables = [t + [0] * (max_blocks - len(t)) for t in block_tables]

    def as_tensor(values: list) -> torch.Tensor:
        return to_device(values, torch.int64, device)

    meta = AttentionMetadata(
        slot_mapping=as_tensor(slot_mapping),
        query_start_loc=as_tensor(query_start_loc),
        seq_lens=as_tensor(seq_lens),
        block_tables=as_tensor(tables),
        query_lens=query_lens,
        seq_lens_list=seq_lens,
        block_size=block_size,
    )
    return StepBatch(as_tensor(input_ids), as_tensor(positions), meta, as_tensor(logits_indices),
                     sampling_rows, sampling_request_ids, pending_inputs,
                     prompt_logprobs if prompt_logprobs.requests else None, pooling,
                     draft_token_ids if any(draft_token_ids) else [])
