"""What a worker keeps of each request from step to step, so that a decode step of it arrives as a few numbers.

Every seeded request's RNG lives here from its first sampled row until it ends. A request the engine marks
``keep`` (a row that samples with settings that stay the same from step to step) also leaves its block table
(one row of a growing array), its sampling row and its adapter here; its later decode steps come as
``DecodeRows`` (an id, a token, a position and the blocks its table gained) and the batch is written from
this state in bulk. The engine keeps the mirror of which requests are kept (``engine/worker_input.py``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from folovllm.lora.request import LoRARequest
from folovllm.sample.metadata import is_plain_greedy_row
from folovllm.sample.rows import SamplingRow
from folovllm.worker.step_input import ScheduledRequest, StepInput


class RequestStates:
    """RNGs by request id, and the kept requests' tables, sampling rows and adapters by row (``row_of``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.generators: dict[str, torch.Generator] = {}  # request id -> its RNG (seeded requests)
        self.row_of: dict[str, int] = {}  # kept request id -> its row in the arrays below
        self._free_rows: list[int] = []
        self.tables = np.zeros((0, 1), dtype=np.int64)  # [rows, blocks]: each kept request's block table
        self.num_blocks = np.zeros(0, dtype=np.int64)  # its table's length
        self.plain_greedy = np.zeros(0, dtype=bool)  # its sampling row is plain greedy (the head's argmax)
        self.count_offset = np.zeros(0, dtype=np.int64)  # its output count less the position it samples at
        self.sampling: list[SamplingRow | None] = []
        self.lora: list[LoRARequest | None] = []
        self.any_lora = 0  # kept requests with an adapter

    def generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        """The request's own RNG, created from its seed on first sight and kept until it finishes."""
        if seed is None:
            return None
        generator = self.generators.get(request_id)
        if generator is None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
            self.generators[request_id] = generator
        return generator

    def forget(self, request_id: str) -> None:
        """The request ended: its RNG and kept state go (its id may be reused)."""
        self.generators.pop(request_id, None)
        row = self.row_of.pop(request_id, None)
        if row is not None:
            if self.lora[row] is not None:
                self.any_lora -= 1
            self.sampling[row] = self.lora[row] = None
            self._free_rows.append(row)

    def update(self, step: StepInput) -> None:
        """The step's kept rows stored as they are now, and its decode rows' tables extended."""
        for request in step.requests:
            if request.keep:
                self._keep(request)
        if step.decodes is not None:
            for request_id, (first, blocks) in step.decodes.new_blocks.items():
                row = self.row_of.get(request_id)
                if row is not None:
                    self._write_table(row, first, blocks)

    def rows(self, request_ids: list[str]) -> np.ndarray:
        """The kept rows of these requests, in order."""
        return np.fromiter(map(self.row_of.__getitem__, request_ids), dtype=np.int64, count=len(request_ids))

    def output_counts(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The output counts of kept rows at these positions (one more token per position since kept)."""
        return positions + self.count_offset[rows]

    def in_full(self, step: StepInput) -> StepInput:
        """The step with its decode rows sent as full requests, as they were kept, at their new positions."""
        decodes = step.decodes
        pending = set(decodes.pending_rows)
        requests = list(step.requests)
        for i, (request_id, token, position) in enumerate(zip(decodes.request_ids, decodes.token_ids,
                                                               decodes.positions)):
            row = self.row_of[request_id]
            sampling = replace(self.sampling[row], num_output_tokens=position + int(self.count_offset[row]))
            requests.append(ScheduledRequest(request_id, [] if i in pending else [token], int(i in pending), position,
                                             self.tables[row, :self.num_blocks[row]].tolist(), sampling,
                                             lora=self.lora[row]))
        return StepInput(requests, step.finished_request_ids)

    def _keep(self, request: ScheduledRequest) -> None:
        row = self.row_of.get(request.request_id)
        if row is None:
            row = self._free_rows.pop() if self._free_rows else self._grow()
            self.row_of[request.request_id] = row
        elif self.lora[row] is not None:
            self.any_lora -= 1
        self.sampling[row] = request.sampling
        self.plain_greedy[row] = is_plain_greedy_row(request.sampling)
        # the row it samples is its last new token's, at num_computed_tokens + num_new_tokens - 1
        self.count_offset[row] = (request.sampling.num_output_tokens
                                  - (request.num_computed_tokens + request.num_new_tokens - 1))
        self.lora[row] = request.lora
        self.any_lora += request.lora is not None
        self._write_table(row, 0, request.block_table)
        self.tables[row, len(request.block_table):] = 0  # a batch's tables are zero past their ends

    def _write_table(self, row: int, first: int, blocks: list[int]) -> None:
        end = first + len(blocks)
        if end > self.tables.shape[1]:
            wider = np.zeros((self.tables.shape[0], max(end, 2 * self.tables.shape[1])), dtype=np.int64)
            wider[:, :self.tables.shape[1]] = self.tables
            self.tables = wider
        self.tables[row, first:end] = blocks
        self.num_blocks[row] = end

    def _grow(self) -> int:
        """One more row (the arrays double when full); returns its index."""
        used = len(self.sampling)
        if used == len(self.num_blocks):
            size = max(16, 2 * used)
            self.tables = np.concatenate([self.tables, np.zeros((size - used, self.tables.shape[1]), np.int64)])
            self.num_blocks = np.concatenate([self.num_blocks, np.zeros(size - used, np.int64)])
            self.plain_greedy = np.concatenate([self.plain_greedy, np.zeros(size - used, bool)])
            self.count_offset = np.concatenate([self.count_offset, np.zeros(size - used, np.int64)])
        self.sampling.append(None)
        self.lora.append(None)
        return used
