"""Turns one step's plain input into one ragged forward pass and samples the next tokens.

``launch`` queues a step's work on the device and returns at once (on CUDA); ``resolve`` waits for
its sampled tokens. Between the two the engine schedules and launches the next step (overlap
scheduling); a token still on the device is fed to the next step straight from device memory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.greedy_head import GreedyHead
from folovllm.sample.prompt_logprobs import (DEFAULT_SLICE_ROWS, PromptLogprobsBatch, PromptLogprobsTensors,
                                             compute_prompt_logprobs)
from folovllm.sample.sampler import Sampler, SamplingRow, TokenLogprobs, build_sampling_batch
from folovllm.tensors import to_device
from folovllm.worker.cuda_graphs import CudaGraphRunner
from folovllm.worker.step_input import StepInput, StepOutput

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


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


@dataclass
class LaunchedStep:
    """A step queued on the device; its sampled tokens are read back by ``ModelRunner.resolve``."""

    request_ids: list[str]  # the rows that sample, in order
    token_ids: torch.Tensor | None  # [len(request_ids)] on the device; None: nothing sampled
    logprobs: list | None
    needs_sync: bool = False  # a logits processor read every earlier token: the next step must wait
    host_token_ids: torch.Tensor | None = None  # CUDA: pinned copy, valid once ``ready`` fires
    ready: torch.cuda.Event | None = None
    prompt_logprobs: PromptLogprobsTensors | None = None  # read back by ``resolve``

    def row_of(self) -> dict[str, int]:
        return {rid: i for i, rid in enumerate(self.request_ids)}


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
    for request in step.requests:
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
        query_start_loc.append(query_start_loc[-1] + num_new)
        query_lens.append(num_new)
        seq_lens.append(end)
        block_tables.append(table)
        if request.sampling is not None:  # caught up: this step's last logits give the next token
            logits_indices.append(query_start_loc[-1] - 1)
            sampling_rows.append(request.sampling)
            sampling_request_ids.append(request.request_id)

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
                     prompt_logprobs if prompt_logprobs.requests else None)


class ModelRunner:
    """Runs one step at a time on the model and its paged KV tensors, then samples."""

    def __init__(self, model: torch.nn.Module, kv_caches: KVCaches, block_size: int, device: torch.device,
                 cuda_graphs: CudaGraphRunner | None = None, samples: bool = True,
                 greedy_head: GreedyHead | None = None) -> None:
        """``samples``: False on tensor-parallel ranks other than 0, which only take part in the
        forward and the logits gather. ``greedy_head``: takes the tokens of an all plain-greedy step
        straight from the hidden states (``cpu_greedy_head``); None: through the logits and sampler."""
        self.model = model
        self.samples = samples
        self.greedy_head = greedy_head
        self.cuda_graphs = cuda_graphs  # decode-step graphs (CUDA + triton backend); None: always eager
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.vocab_size = model.arch.vocab_size

    @torch.inference_mode()
    def launch(self, step: StepInput, generators: list[torch.Generator | None],
               previous: LaunchedStep | None = None) -> LaunchedStep:
        """Queues the step's forward and sampling. ``generators``: one per sampling row (None: the
        default RNG); ``previous`` holds the tokens its inputs still await."""
        batch = prepare_step_batch(step, self.block_size, self.device)
        if batch.pending_inputs:
            self._fill_pending_inputs(batch, previous)
        hidden = self._forward(batch)
        if not self.samples:
            self._join_logits_gathers(batch, hidden)
            return LaunchedStep([], None, None)
        prompt_logprobs = None
        if batch.prompt_logprobs is not None:
            prompt_logprobs = compute_prompt_logprobs(hidden, batch.prompt_logprobs, self.model.compute_logits)
        if not batch.sampling_rows:
            return LaunchedStep([], None, None, prompt_logprobs=prompt_logprobs)
        sampling_batch = build_sampling_batch(batch.sampling_rows, generators, self.vocab_size, self.device)
        if self.greedy_head is not None and sampling_batch.is_plain_greedy:
            token_ids = self.greedy_head(hidden[batch.logits_indices])
            logprobs: list[TokenLogprobs | None] = [None] * sampling_batch.num_rows
        else:
            logits = self.model.compute_logits(hidden[batch.logits_indices])
            token_ids, logprobs = self.sampler.sample(logits, sampling_batch)
        launched = LaunchedStep(batch.sampling_request_ids, token_ids, logprobs, sampling_batch.needs_sync,
                                prompt_logprobs=prompt_logprobs)
        if self.device.type == "cuda":  # start the copy home now; resolve() only waits for it
            launched.host_token_ids = torch.empty(token_ids.shape, dtype=token_ids.dtype, pin_memory=True)
            launched.host_token_ids.copy_(token_ids, non_blocking=True)
            launched.ready = torch.cuda.Event()
            launched.ready.record()
        return launched

    @staticmethod
    def resolve(launched: LaunchedStep) -> StepOutput:
        """Waits for the step's sampled tokens and hands them over as host lists."""
        start = time.perf_counter()
        prompt_logprobs = launched.prompt_logprobs.to_host() if launched.prompt_logprobs is not None else []
        if launched.token_ids is None:
            return StepOutput(prompt_logprobs=prompt_logprobs, wait_s=time.perf_counter() - start)
        if launched.ready is not None:
            launched.ready.synchronize()
            ids = launched.host_token_ids.tolist()
        else:
            ids = launched.token_ids.tolist()
        return StepOutput(launched.request_ids, ids, launched.logprobs, prompt_logprobs,
                          time.perf_counter() - start)

    def _join_logits_gathers(self, batch: StepBatch, hidden: torch.Tensor) -> None:
        """A rank that does not sample computes its vocab slice of the same logits rank 0 asks for,
        call for call, so that every gather of rank 0 is met."""
        if batch.prompt_logprobs is not None:  # rank 0 turns these rows into logits a slice at a time
            rows = batch.prompt_logprobs.row_indices
            for start in range(0, len(rows), DEFAULT_SLICE_ROWS):
                self.model.compute_logits(hidden[rows[start:start + DEFAULT_SLICE_ROWS]])
        if batch.sampling_rows:
            self.model.compute_logits(hidden[batch.logits_indices])

    @staticmethod
    def _fill_pending_inputs(batch: StepBatch, previous: LaunchedStep | None) -> None:
        """Copies the previous step's sampled tokens into this step's inputs, device to device."""
        if previous is None or previous.token_ids is None:
            raise RuntimeError("a step needs tokens from a step that is not in flight")
        rows = previous.row_of()
        device = batch.input_ids.device
        dst = to_device([row for row, _ in batch.pending_inputs], torch.int64, device)
        src = to_device([rows[rid] for _, rid in batch.pending_inputs], torch.int64, device)
        batch.input_ids[dst] = previous.token_ids[src].to(batch.input_ids.dtype)

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        """Hidden states of the step: a CUDA graph replay for decode-only batches that fit one."""
        ids, positions, meta = batch.input_ids, batch.positions, batch.attn_metadata
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(ids, meta):
            return self.cuda_graphs.run(ids, positions, meta)
        return self.model(ids, positions, self.kv_caches, meta)

