"""CUDA graphs for decode-only steps: capture the model forward once per batch size, then replay it.

A decode step launches hundreds of small kernels; replaying a captured graph launches them all at
once, without Python in between. A graph is fixed to the addresses and shapes it was captured
with, so the model reads its inputs from static buffers (``DecodeInputs``) sized for the largest
batch, and a batch of B sequences runs in the smallest captured graph with room for B: the spare
rows are padding (slot -1: nothing is written; seq_len 0: attention reads nothing, outputs zeros).

Needs an attention backend that never syncs with the host (the triton backend). Steps with any
prefill token, or more sequences than the largest graph, run eagerly.
"""
from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass

import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.config import EngineConfig
from folovllm.paging import blocks_for_tokens

logger = logging.getLogger(__name__)

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def capture_sizes(max_batch: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, then every multiple of 8, up to and including ``max_batch``."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch, 8))
    return sizes + [max_batch]


@dataclass
class DecodeInputs:
    """Static model inputs for up to ``max_batch`` decoding sequences (one token each).

    Graphs captured on views of these tensors read whatever the last ``fill`` wrote there.
    """

    input_ids: torch.Tensor  # [max_batch]
    positions: torch.Tensor  # [max_batch]
    slot_mapping: torch.Tensor  # [max_batch], -1 on padding rows
    query_start_loc: torch.Tensor  # [max_batch + 1] = 0, 1, 2, ...: one token per sequence, never changes
    seq_lens: torch.Tensor  # [max_batch], 0 on padding rows
    block_tables: torch.Tensor  # [max_batch, max_blocks_per_seq]
    block_size: int

    @classmethod
    def allocate(cls, max_batch: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device) -> DecodeInputs:
        """Buffers that describe ``max_batch`` padding rows until the first ``fill``."""
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=device)

        return cls(zeros(max_batch), zeros(max_batch), torch.full_like(zeros(max_batch), -1),
                   torch.arange(max_batch + 1, device=device), zeros(max_batch),
                   zeros(max_batch, max_blocks_per_seq), block_size)

    def fill(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
             size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Copy a decode batch (one token per sequence) into rows ``[0, B)`` and make rows
        ``[B, size)`` padding; returns the first ``size`` rows as model inputs."""
        n, width = input_ids.shape[0], meta.block_tables.shape[1]
        if n != meta.num_seqs or n > size or width > self.block_tables.shape[1]:
            raise ValueError(f"not a decode batch that fits {size} rows of "
                             f"{self.block_tables.shape[1]} blocks: {n} tokens, {meta.num_seqs} sequences, "
                             f"{width} blocks")
        self.input_ids[:n].copy_(input_ids)
        self.input_ids[n:size].zero_()
        self.positions[:n].copy_(positions)
        self.positions[n:size].zero_()
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:size].zero_()
        # Columns past `width` keep older block ids: attention never reads past a sequence's length.
        self.block_tables[:n, :width].copy_(meta.block_tables)
        return self.view(size, list(meta.seq_lens_list) + [0] * (size - n))

    def view(self, size: int, seq_lens_list: list[int] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """The first ``size`` rows as (input_ids, positions, metadata); views, so a graph captured
        on them sees every later ``fill``. ``seq_lens_list`` defaults to all-padding rows."""
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            query_lens=[1] * size,
            seq_lens_list=[0] * size if seq_lens_list is None else seq_lens_list,
            block_size=self.block_size,
        )
        return self.input_ids[:size], self.positions[:size], meta


class CudaGraphRunner:
    """Decode-step graphs of ``model`` for a ladder of batch sizes, sharing one memory pool."""

    def __init__(self, model: torch.nn.Module, kv_caches: KVCaches, block_size: int, max_model_len: int,
                 max_batch: int, device: torch.device) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1; got {max_batch}")
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_batch)
        self.max_blocks_per_seq = blocks_for_tokens(max_model_len, block_size)
        self.inputs = DecodeInputs.allocate(max_batch, self.max_blocks_per_seq, block_size, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # each graph's hidden states, in the shared pool

    def padded_size(self, num_seqs: int) -> int:
        """The smallest captured batch size with room for ``num_seqs`` sequences."""
        return self.sizes[bisect.bisect_left(self.sizes, num_seqs)]

    def can_run(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> bool:
        """True for decode-only batches (one token per sequence) that fit the largest graph."""
        num_tokens = input_ids.shape[0]
        return (bool(self.graphs) and num_tokens == meta.num_seqs and num_tokens <= self.sizes[-1]
                and meta.block_tables.shape[1] <= self.max_blocks_per_seq)

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every size, largest first so smaller graphs reuse its pool memory.

        Every buffer row is padding meanwhile, so neither warm-up nor capture writes the KV cache.
        """
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            input_ids, positions, meta = self.inputs.view(size)
            for _ in range(2):  # compiles the Triton kernels for this shape before capture
                self.model(input_ids, positions, self.kv_caches, meta)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.model(input_ids, positions, self.kv_caches, meta)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured decode CUDA graphs for %d batch sizes (1..%d) in %.1f s",
                    len(self.sizes), self.sizes[-1], time.perf_counter() - start)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Replay the graph for this decode batch; returns its hidden states [B, hidden].

        The result is a view into graph-owned memory: the next replay overwrites it.
        """
        num_seqs = input_ids.shape[0]
        size = self.padded_size(num_seqs)
        self.inputs.fill(input_ids, positions, meta, size)
        self.graphs[size].replay()
        return self.outputs[size][:num_seqs]


def capture_decode_graphs(model: torch.nn.Module, kv_caches: KVCaches, config: EngineConfig,
                          max_model_len: int) -> CudaGraphRunner | None:
    """Decode graphs when they apply (the triton backend, no ``enforce_eager``; the worker asks only on a
    platform that captures graphs), else None. ``config`` is resolved: its device and backend are not "auto"."""
    device = torch.device(config.device)
    if config.attention_backend != "triton" or config.enforce_eager:
        return None
    # A decode batch never holds more sequences than the scheduler admits or its token budget.
    max_batch = min(config.cuda_graph_max_batch, config.max_num_seqs, config.max_num_batched_tokens)
    runner = CudaGraphRunner(model, kv_caches, config.block_size, max_model_len, max_batch, device)
    runner.capture()
    return runner
