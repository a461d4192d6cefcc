"""Turns one scheduler decision into one ragged forward pass and samples the next tokens.

``launch`` queues a step's work on the device and returns at once (on CUDA); ``resolve`` waits for
its sampled tokens. Between the two the engine schedules and launches the next step (overlap
scheduling); a token still on the device is fed to the next step straight from device memory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.core.scheduler import SchedulerOutput
from folovllm.request import Request
from folovllm.sample.sampler import Sampler, SamplerOutput, build_sampling_batch
from folovllm.tensors import to_device
from folovllm.worker.cuda_graphs import CudaGraphRunner


@dataclass
class StepBatch:
    """The model inputs of one step: every scheduled token end to end, no padding."""

    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor  # rows of the hidden states whose next token is sampled
    sampling_requests: list[Request]  # the requests those rows belong to, in order
    # Rows whose input token is still pending on the device (overlap): (row, request id).
    pending_inputs: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class LaunchedStep:
    """A step queued on the device; its sampled tokens are read back by ``ModelRunner.resolve``."""

    sampled_requests: list[Request]
    token_ids: torch.Tensor | None  # [len(sampled_requests)] on the device; None: nothing sampled
    logprobs: list | None
    needs_penalties: bool = False  # some row's penalties count every earlier output token
    host_token_ids: torch.Tensor | None = None  # CUDA: pinned copy, valid once ``ready`` fires
    ready: torch.cuda.Event | None = None

    def row_of(self) -> dict[str, int]:
        return {r.request_id: i for i, r in enumerate(self.sampled_requests)}


@dataclass
class StepResult:
    sampled_requests: list[Request]
    sampler_output: SamplerOutput | None
    wait_s: float = 0.0  # time spent blocked on the device for this result


def allocate_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int, dtype: torch.dtype, device: torch.device
                       ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One preallocated K and V tensor per layer, ``[num_blocks, block_size, kv_heads, head_dim]``."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device),
             torch.zeros(shape, dtype=dtype, device=device)) for _ in range(num_layers)]


def prepare_step_batch(sched: SchedulerOutput, block_size: int, device: torch.device) -> StepBatch:
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    logits_indices: list[int] = []
    sampling_requests: list[Request] = []
    pending_inputs: list[tuple[int, str]] = []
    for request, num_new, table in zip(sched.requests, sched.num_new_tokens, sched.block_tables):
        start = request.num_computed_tokens
        end = start + num_new
        input_ids.extend(request.token_ids[start:end])
        for pos in range(max(start, len(request.token_ids)), end):  # not known yet: on the device
            pending_inputs.append((len(input_ids), request.request_id))
            input_ids.append(0)
        positions.extend(range(start, end))
        slot_mapping.extend(table[pos // block_size] * block_size + pos % block_size
                            for pos in range(start, end))
        query_start_loc.append(query_start_loc[-1] + num_new)
        seq_lens.append(end)
        if end == request.num_tokens:  # caught up: this step's last logits give the next token
            logits_indices.append(query_start_loc[-1] - 1)
            sampling_requests.append(request)

    max_blocks = max(len(t) for t in sched.block_tables)
    tables = [t + [0] * (max_blocks - len(t)) for t in sched.block_tables]

    def as_tensor(values: list) -> torch.Tensor:
        return to_device(values, torch.int64, device)

    meta = AttentionMetadata(
        slot_mapping=as_tensor(slot_mapping),
        query_start_loc=as_tensor(query_start_loc),
        seq_lens=as_tensor(seq_lens),
        block_tables=as_tensor(tables),
        query_lens=list(sched.num_new_tokens),
        seq_lens_list=seq_lens,
        block_size=block_size,
    )
    return StepBatch(as_tensor(input_ids), as_tensor(positions), meta, as_tensor(logits_indices),
                     sampling_requests, pending_inputs)


class ModelRunner:
    """Owns the model, its paged KV tensors and the sampler; runs one step at a time."""

    def __init__(self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, device: torch.device, cuda_graphs: CudaGraphRunner | None = None) -> None:
        self.model = model
        self.cuda_graphs = cuda_graphs  # decode-step graphs (CUDA + triton backend); None: always eager
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.vocab_size = model.arch.vocab_size

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput, previous: LaunchedStep | None = None) -> LaunchedStep:
        """Queues the step's forward and sampling; ``previous`` holds tokens its inputs still await."""
        batch = prepare_step_batch(sched, self.block_size, self.device)
        if batch.pending_inputs:
            self._fill_pending_inputs(batch, previous)
        hidden = self._forward(batch)
        if not batch.sampling_requests:
            return LaunchedStep([], None, None)
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        requests = batch.sampling_requests
        sampling_batch = build_sampling_batch(
            params=[r.params for r in requests],
            prompt_token_ids=[r.prompt_token_ids for r in requests],
            output_token_ids=[r.output_token_ids for r in requests],
            generators=[r.generator for r in requests],
            banned_token_ids=[_banned_token_ids(r) for r in requests],
            vocab_size=self.vocab_size,
            device=self.device,
        )
        token_ids, logprobs = self.sampler.sample(logits, sampling_batch)
        step = LaunchedStep(requests, token_ids, logprobs, sampling_batch.needs_penalties)
        if self.device.type == "cuda":  # start the copy home now; resolve() only waits for it
            step.host_token_ids = torch.empty(token_ids.shape, dtype=token_ids.dtype, pin_memory=True)
            step.host_token_ids.copy_(token_ids, non_blocking=True)
            step.ready = torch.cuda.Event()
            step.ready.record()
        return step

    def resolve(self, step: LaunchedStep) -> StepResult:
        """Waits for the step's sampled tokens and hands them over as host lists."""
        if step.token_ids is None:
            return StepResult([], None)
        start = time.perf_counter()
        if step.ready is not None:
            step.ready.synchronize()
            ids = step.host_token_ids.tolist()
        else:
            ids = step.token_ids.tolist()
        return StepResult(step.sampled_requests, SamplerOutput(ids, step.logprobs),
                          time.perf_counter() - start)

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


def _banned_token_ids(request: Request) -> list[int]:
    """Tokens that would end the request before ``min_tokens`` outputs are not sampled yet."""
    params = request.params
    if request.num_output_tokens >= params.min_tokens:
        return []
    banned = list(params.stop_token_ids)
    if not params.ignore_eos:
        banned.extend(request.eos_token_ids)
    return banned
