"""Decode-only steps on the CPU: the model inputs written into host buffers that such steps reuse.

A decode step's inputs are a few integers per request, yet ``prepare_step_batch`` builds a fresh tensor
for each field every step, and after a forward that streamed the weights through the caches each of
those builds costs several times what it does in a micro-benchmark. Here the fields live in one int64
buffer: a step writes its integers through numpy views of it and hands the model tensor views made once
per batch shape (requests x block-table width; one stream's width grows every ``block_size`` tokens).
The values, dtypes and shapes are those of ``prepare_step_batch``; only where they are stored differs.
Only a synchronous platform (the CPU) takes it: a CUDA step may still be reading its inputs while the next
one is prepared. ``ModelRunner(decode_input_buffers=False)`` builds every step with ``prepare_step_batch``.
"""
from __future__ import annotations

import numpy as np
import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.worker.step_batch import StepBatch
from folovllm.worker.step_input import StepInput


def is_decode_only(step: StepInput) -> bool:
    """Every request adds one token the host knows and samples the next (no prompt chunk, no token
    pending on the device, no prompt logprobs)."""
    return all(len(r.new_token_ids) == 1 and not r.num_pending_tokens and r.sampling is not None
               and r.prompt_logprobs is None for r in step.requests)


class _ShapeBuffers:
    """One batch shape's buffer, as numpy views (written each step) and tensor views (given to the model).

    Layout: input ids | positions | slots | seq lens | logits rows | query starts | block tables.
    The logits rows (every row) and query starts (one token each) are the same every step: written once.
    """

    def __init__(self, num_seqs: int, width: int) -> None:
        n = num_seqs
        flat = np.zeros(6 * n + 1 + n * width, dtype=np.int64)
        tensor = torch.from_numpy(flat)
        self.shape = (num_seqs, width)
        self.ids, self.positions, self.slots, self.seq_lens = (flat[i * n:(i + 1) * n] for i in range(4))
        self.tables = flat[6 * n + 1:].reshape(n, width)
        flat[4 * n:5 * n] = np.arange(n)
        flat[5 * n:6 * n + 1] = np.arange(n + 1)
        self.ids_t, self.positions_t, self.slots_t, self.seq_lens_t, self.logits_t = (
            tensor[i * n:(i + 1) * n] for i in range(5))
        self.query_start_t = tensor[5 * n:6 * n + 1]
        self.tables_t = tensor[6 * n + 1:].view(n, width)


class DecodeInputBuffers:
    """Builds a decode-only step's ``StepBatch`` in reused buffers (the module doc says when)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._buffers: _ShapeBuffers | None = None  # the last shape's: a stream keeps one for many steps

    def prepare(self, step: StepInput) -> StepBatch:
        """The step's batch; the tensors it holds are overwritten by the next decode-only step."""
        requests = step.requests
        width = max(len(r.block_table) for r in requests)
        buffers = self._buffers
        if buffers is None or buffers.shape != (len(requests), width):
            buffers = self._buffers = _ShapeBuffers(len(requests), width)
        ids, positions, slots, seq_lens, tables = (buffers.ids, buffers.positions, buffers.slots,
                                                   buffers.seq_lens, buffers.tables)
        block_size = self.block_size
        seq_lens_list = []
        for row, request in enumerate(requests):
            position, table = request.num_computed_tokens, request.block_table
            ids[row] = request.new_token_ids[0]
            positions[row] = position
            slots[row] = table[position // block_size] * block_size + position % block_size
            seq_lens[row] = position + 1
            seq_lens_list.append(position + 1)
            tables[row, :len(table)] = table
            if len(table) < width:
                tables[row, len(table):] = 0
        meta = AttentionMetadata(
            slot_mapping=buffers.slots_t,
            query_start_loc=buffers.query_start_t,
            seq_lens=buffers.seq_lens_t,
            block_tables=buffers.tables_t,
            query_lens=[1] * len(requests),
            seq_lens_list=seq_lens_list,
            block_size=block_size,
        )
        return StepBatch(buffers.ids_t, buffers.positions_t, meta, buffers.logits_t,
                         [r.sampling for r in requests], [r.request_id for r in requests])
