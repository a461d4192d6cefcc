"""What a decode CUDA graph reads, in static device buffers, and the host staging they are filled from.

A graph is fixed to the addresses it was captured with, so everything a decode step varies lives in buffers
sized for the largest batch: one int64 table of per-row fields, a float table (temperature, top-p, min-p) and
the block tables. The int table's first row is ``next_tokens``, where each step's graph writes its tokens;
its second the tokens the host knows; each row's input token is one gather over the two (``token_index``:
the previous step's row it awaits, or its own host token). Then position, cache slot, context length, the
row's sampling settings and noise key.

The host writes a step into pinned staging buffers (a ring of them, each reused once the copy that read it
has run) and queues one copy per table; no tensor is made per step. Rows past the batch are padding: slot -1
(nothing is written), context 0 (attention reads nothing), greedy.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from folovllm.attention.metadata import AttentionMetadata
from folovllm.platforms import Platform
from folovllm.sample.metadata import noise_keys
from folovllm.sample.rows import SamplingRow
from folovllm.worker.step_input import ScheduledRequest

INT_FIELDS = ("next_token", "token", "token_index", "position", "slot", "seq_len", "greedy", "top_k", "seed",
              "counter")
FLOAT_FIELDS = ("temperature", "top_p", "min_p")
# a padding row: host token 0 (its own), no slot, no context, greedy, every sampling filter off
INT_PADDING = {"token": 0, "position": 0, "slot": -1, "seq_len": 0, "greedy": 1, "seed": 0, "counter": 0}
FLOAT_PADDING = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0}
RING = 3  # staging buffers in turn: a step's copies may still be queued while the next steps are staged


class GraphInputs:
    """The static buffers of up to ``max_batch`` decode rows and their host staging (see the module doc)."""

    def __init__(self, max_batch: int, max_blocks: int, block_size: int, vocab_size: int, platform: Platform,
                 device: torch.device) -> None:
        self.max_batch, self.block_size, self.vocab_size = max_batch, block_size, vocab_size
        self.platform = platform
        self.ints = torch.zeros(len(INT_FIELDS), max_batch, dtype=torch.int64, device=device)
        self.floats = torch.zeros(len(FLOAT_FIELDS), max_batch, dtype=torch.float32, device=device)
        self.block_tables = torch.zeros(max_batch, max_blocks, dtype=torch.int64, device=device)
        self.query_start_loc = torch.arange(max_batch + 1, device=device)  # one token per row, never changes
        self.next_tokens = self.ints[0]
        self._staging = [(platform.host_buffer(tuple(self.ints.shape), torch.int64),
                          platform.host_buffer(tuple(self.floats.shape), torch.float32),
                          platform.host_buffer(tuple(self.block_tables.shape), torch.int64)) for _ in range(RING)]
        self._copied: list = [None] * RING  # each staging's copy event (None: done, or a synchronous device)
        self._homes = [platform.host_buffer((max_batch,), torch.int64) for _ in range(RING)]
        self._turn = 0  # the ring entry of the step staged last
        for ints, floats, _ in self._staging:
            _pad(ints.numpy(), floats.numpy(), 0, max_batch, max_batch, vocab_size)
        self.ints[1:].copy_(self._staging[0][0][1:])
        self.floats.copy_(self._staging[0][1])

    def int_field(self, name: str, size: int) -> torch.Tensor:
        """The first ``size`` rows of one int field (a contiguous view)."""
        return self.ints[INT_FIELDS.index(name), :size]

    def float_field(self, name: str, size: int) -> torch.Tensor:
        return self.floats[FLOAT_FIELDS.index(name), :size]

    def input_ids(self, size: int) -> torch.Tensor:
        """Each row's input token: the previous step's from ``next_tokens`` (read on the device), or the host's."""
        return self.ints[:2].view(-1).index_select(0, self.int_field("token_index", size))

    def metadata(self, size: int) -> AttentionMetadata:
        """The first ``size`` rows as attention metadata: views, so a graph captured on them sees every step."""
        return AttentionMetadata(slot_mapping=self.int_field("slot", size),
                                 query_start_loc=self.query_start_loc[:size + 1],
                                 seq_lens=self.int_field("seq_len", size), block_tables=self.block_tables[:size],
                                 query_lens=[1] * size, seq_lens_list=[0] * size, block_size=self.block_size)

    def stage(self, requests: Sequence[ScheduledRequest], sources: Sequence[int], size: int,
              noise_seed: int | None) -> None:
        """Writes a decode step (one token per request; ``sources[i]``: the row of the previous step's tokens
        that request i's input token is, -1 where the host knows it) into the next staging buffers, rows past
        the batch as padding up to ``size``, and queues their copies to the device. ``noise_seed``: the step's
        seed for unseeded rows' noise keys (None: every row greedy, no key needed)."""
        turn = self._turn = (self._turn + 1) % RING
        copied = self._copied[turn]
        if copied is not None and not copied.query():  # the copy that last read these buffers must have run
            copied.synchronize()
        ints_t, floats_t, tables_t = self._staging[turn]
        ints, floats, tables = ints_t.numpy(), floats_t.numpy(), tables_t.numpy()
        n = len(requests)
        rows: list[SamplingRow] = [r.sampling for r in requests]
        bs = self.block_size
        positions = [r.num_computed_tokens for r in requests]
        fields = {
            "token": [r.new_token_ids[0] if r.new_token_ids else 0 for r in requests],
            "token_index": [s if s >= 0 else self.max_batch + i for i, s in enumerate(sources)],
            "position": positions,
            "slot": [r.block_table[p // bs] * bs + p % bs for r, p in zip(requests, positions)],
            "seq_len": [p + 1 for p in positions],
            "greedy": [int(row.params.greedy) for row in rows],
            "top_k": [self.vocab_size if row.params.top_k == -1 else min(row.params.top_k, self.vocab_size)
                      for row in rows],
        }
        if noise_seed is not None:
            fields["seed"], fields["counter"] = noise_keys(rows, noise_seed)
        for name, values in fields.items():
            ints[INT_FIELDS.index(name), :n] = values
        floats[FLOAT_FIELDS.index("temperature"), :n] = [1.0 if row.params.greedy else row.params.temperature
                                                         for row in rows]
        floats[FLOAT_FIELDS.index("top_p"), :n] = [row.params.top_p for row in rows]
        floats[FLOAT_FIELDS.index("min_p"), :n] = [row.params.min_p for row in rows]
        _pad(ints, floats, n, size, self.max_batch, self.vocab_size)
        for i, request in enumerate(requests):  # columns past a row's table keep older ids: never read
            tables[i, :len(request.block_table)] = request.block_table
        self.ints[1:].copy_(ints_t[1:], non_blocking=True)  # the first row is the graphs' own
        self.floats.copy_(floats_t, non_blocking=True)
        self.block_tables[:n].copy_(tables_t[:n], non_blocking=True)
        self._copied[turn] = self.platform.record_event()

    def copy_home(self, n: int) -> tuple[torch.Tensor, object]:
        """Starts copying the first ``n`` of ``next_tokens`` into a host buffer of the ring; (it, the copy's
        event, None on a synchronous device): the ring entry of the step staged last, which holds it until two more
        steps have been staged (the engine resolves a step before it launches the one after next)."""
        host = self._homes[self._turn][:n]
        host.copy_(self.next_tokens[:n], non_blocking=True)
        return host, self.platform.record_event()


def _pad(ints, floats, start: int, stop: int, max_batch: int, vocab_size: int) -> None:
    """Rows ``[start, stop)`` of the staging tables as padding rows."""
    for name, value in INT_PADDING.items():
        ints[INT_FIELDS.index(name), start:stop] = value
    ints[INT_FIELDS.index("token_index"), start:stop] = range(max_batch + start, max_batch + stop)
    ints[INT_FIELDS.index("top_k"), start:stop] = vocab_size
    for name, value in FLOAT_PADDING.items():
        floats[FLOAT_FIELDS.index(name), start:stop] = value
