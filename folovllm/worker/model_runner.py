"""Turns one scheduler decision into one ragged forward pass and samples the next tokens."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.core.scheduler import SchedulerOutput
from folovllm.request import Request
from folovllm.sample.sampler import Sampler, SamplerOutput, build_sampling_batch
from folovllm.worker.cuda_graphs import CudaGraphRunner


@dataclass
class StepBatch:
    """The model inputs of one step: every scheduled token end to end, no padding."""

    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor  # rows of the hidden states whose next token is sampled
    sampling_requests: list[Request]  # the requests those rows belong to, in order


@dataclass
class StepResult:
    sampled_requests: list[Request]
    sampler_output: SamplerOutput | None


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
    for request, num_new, table in zip(sched.requests, sched.num_new_tokens, sched.block_tables):
        start = request.num_computed_tokens
        end = start + num_new
        input_ids.extend(request.token_ids[start:end])
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
        return torch.tensor(values, dtype=torch.int64, device=device)

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
                     sampling_requests)


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
    def execute(self, sched: SchedulerOutput) -> StepResult:
        batch = prepare_step_batch(sched, self.block_size, self.device)
        hidden = self._forward(batch)
        if not batch.sampling_requests:
            return StepResult([], None)
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
        return StepResult(requests, self.sampler.forward(logits, sampling_batch))

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
