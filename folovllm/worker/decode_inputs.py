"""Decode-only steps: every row one token at its position, the model inputs written with numpy in bulk.

A decode step's inputs are a few integers per request. ``DecodeColumns`` holds them as arrays (the token, the
position, the block table of each row): from the requests the worker keeps (``RequestStates``, the step's
``DecodeRows``) or, for a step of general rows, read off its ``ScheduledRequest``s. ``DecodeBatchWriter``
turns them into the step's tensors: the slots, context lengths and the rest computed on whole arrays.

On a synchronous platform (the CPU) the fields live in one int64 buffer that such steps reuse, written through
numpy views, with tensor views made once per batch shape (requests x block-table width): after a forward that
streamed the weights through the caches, building fresh tensors costs several times what it does in a
micro-benchmark. An asynchronous device may still read a step's inputs while the next one is prepared, so there
the fields are written into a fresh host block and copied over once. The values, dtypes and shapes are those of
``prepare_step_batch``; only where they are stored differs.
"""
from __future__ import annotations

import numpy as np
import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.platforms import to_device
from folovllm.sample.rows import SamplingRow
from folovllm.worker.step_batch import DecodeColumns, StepBatch
from folovllm.worker.step_input import StepInput


def is_decode_only(step: StepInput) -> bool:
    """Every general row (``step.requests``) adds one token the host knows and samples the next (no prompt
    chunk, no token pending on the device, no prompt logprobs)."""
    return all(len(r.new_token_ids) == 1 and not r.num_pending_tokens and r.sampling is not None
               and r.prompt_logprobs is None for r in step.requests)


class _ShapeBuffers:
    """One batch shape's int64 block, as numpy views (written each step) and tensor views (given to the model).

    Layout: input ids | positions | slots | seq lens | logits rows | query starts | block tables.
    The logits rows (every row) and query starts (one token each) are the same every step: written once.
    """

    def __init__(self, num_seqs: int, width: int, device: torch.device | None = None) -> None:
        n = num_seqs
        flat = np.zeros(6 * n + 1 + n * width, dtype=np.int64)
        self.shape = (num_seqs, width)
        self.flat = flat
        self.ids, self.positions, self.slots, self.seq_lens = (flat[i * n:(i + 1) * n] for i in range(4))
        self.tables = flat[6 * n + 1:].reshape(n, width)
        flat[4 * n:5 * n] = np.arange(n)
        flat[5 * n:6 * n + 1] = np.arange(n + 1)
        self.set_tensor(torch.from_numpy(flat))

    def set_tensor(self, tensor: torch.Tensor) -> None:
        """The model's tensors: views of ``tensor``, the block (or its copy on the device)."""
        n, width = self.shape
        self.ids_t, self.positions_t, self.slots_t, self.seq_lens_t, self.logits_t = (
            tensor[i * n:(i + 1) * n] for i in range(5))
        self.query_start_t = tensor[5 * n:6 * n + 1]
        self.tables_t = tensor[6 * n + 1:].view(n, width)


class DecodeBatchWriter:
    """Builds a decode-only step's ``StepBatch`` from ``DecodeColumns`` (the module doc says where it writes)."""

    def __init__(self, block_size: int, device: torch.device, reuse_buffers: bool) -> None:
        self.block_size = block_size
        self.device = device
        self.reuse_buffers = reuse_buffers
        self._buffers: _ShapeBuffers | None = None  # the last shape's: a stream keeps one for many steps

    def batch(self, columns: DecodeColumns, sampling_rows: list[SamplingRow], request_ids: list[str]) -> StepBatch:
        """The step's batch; with reused buffers its tensors are overwritten by the next decode-only step."""
        shape = columns.tables.shape
        buffers = self._buffers
        if not self.reuse_buffers or buffers is None or buffers.shape != shape:
            buffers = _ShapeBuffers(*shape)
            if self.reuse_buffers:
                self._buffers = buffers
        positions = columns.positions
        buffers.ids[:] = columns.token_ids
        buffers.positions[:] = positions
        buffers.slots[:] = columns.slot_mapping(self.block_size)
        buffers.seq_lens[:] = positions + 1
        buffers.tables[:] = columns.tables
        if not self.reuse_buffers:  # one copy of the whole block to the device, then views of it
            buffers.set_tensor(to_device(buffers.flat, torch.int64, self.device))
        meta = AttentionMetadata(
            slot_mapping=buffers.slots_t,
            query_start_loc=buffers.query_start_t,
            seq_lens=buffers.seq_lens_t,
            block_tables=buffers.tables_t,
            query_lens=[1] * len(columns),
            seq_lens_list=buffers.seq_lens.tolist(),
            block_size=self.block_size,
        )
        return StepBatch(buffers.ids_t, buffers.positions_t, meta, buffers.logits_t, sampling_rows, request_ids)
