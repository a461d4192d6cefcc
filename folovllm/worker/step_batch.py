"""One step's model inputs as tensors: every scheduled token end to end, no padding, and the rows sampled."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.platforms import to_device
from folovllm.pooling.pooler import PoolingChunk
from folovllm.sample.prompt_logprobs import PromptLogprobsBatch
from folovllm.sample.sampler import SamplingRow
from folovllm.worker.step_input import ScheduledRequest, StepInput


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
    plain_greedy: bool | None = None  # every sampling row is plain greedy (None: read the rows)
    kept_rows_only: bool = False  # every row is a kept request's decode row (their sampling settings never change)
    # the output counts of the kept decode rows that end the sampling rows (their kept rows' counts are stale)
    decode_output_counts: np.ndarray | None = None


@dataclass
class DecodeColumns:
    """Decode rows' inputs as arrays: row ``i`` computes ``token_ids[i]`` at ``positions[i]`` with block table
    ``tables[i]`` (zero past its length)."""

    token_ids: np.ndarray  # [n] int64
    positions: np.ndarray  # [n] int64
    tables: np.ndarray  # [n, width] int64

    @classmethod
    def from_requests(cls, requests: list[ScheduledRequest]) -> DecodeColumns:
        """General rows that each compute one known token."""
        width = max(len(r.block_table) for r in requests)
        tables = np.zeros((len(requests), width), dtype=np.int64)
        for row, request in enumerate(requests):
            tables[row, :len(request.block_table)] = request.block_table
        return cls(np.fromiter((r.new_token_ids[0] for r in requests), np.int64, len(requests)),
                   np.fromiter((r.num_computed_tokens for r in requests), np.int64, len(requests)), tables)

    def __len__(self) -> int:
        return len(self.positions)

    def slot_mapping(self, block_size: int) -> np.ndarray:
        """Each row's cache slot: its table's block at its position, times the block size, plus the offset."""
        positions = self.positions
        blocks = self.tables[np.arange(len(positions)), positions // block_size]
        return blocks * block_size + positions % block_size


@dataclass
class DecodePart:
    """Decode rows that follow a step's general rows in its batch: their columns and sampling settings."""

    columns: DecodeColumns
    sampling_rows: list[SamplingRow]
    request_ids: list[str]
    pending_rows: list[int]  # rows whose token is still pending on the device


def prepare_step_batch(step: StepInput, block_size: int, device: torch.device,
                       decode: DecodePart | None = None) -> StepBatch:
    """The step's general rows (``step.requests``) and then, if given, its decode rows, as the model's tensors."""
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
    if decode is not None:
        columns, first, base, n = decode.columns, len(input_ids), query_start_loc[-1], len(decode.columns)
        input_ids.extend(columns.token_ids.tolist())
        pending_inputs.extend((first + row, decode.request_ids[row]) for row in decode.pending_rows)
        positions.extend(columns.positions.tolist())
        slot_mapping.extend(columns.slot_mapping(block_size).tolist())
        query_start_loc.extend(range(base + 1, base + n + 1))
        query_lens.extend([1] * n)
        seq_lens.extend((columns.positions + 1).tolist())
        block_tables.extend(columns.tables.tolist())
        logits_indices.extend(range(base, base + n))
        sampling_rows.extend(decode.sampling_rows)
        sampling_request_ids.extend(decode.request_ids)
        draft_token_ids.extend([] for _ in range(n))

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
