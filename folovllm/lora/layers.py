"""The batched LoRA op in the linear-method seam: a method that wraps the layer's own (plain, packed, GPTQ,
int8) and adds, to each row of a step, its adapter's ``x·Aᵀ·Bᵀ`` (scale folded into B).

Rows are grouped by adapter slot once per step (``LoRABatch``, set by the worker's ``LoRAManager`` from the
step's requests; the engine puts one adapter's rows side by side, so each group is a slice). Each linear
then multiplies, per adapter present, that adapter's rows by its B pieces (a merged q/k/v or gate/up linear's
piece adds to its own outputs only): the B side, where most of an adapter's weights are, is read once per
adapter and multiplied by its own rows only. The A side is one matmul of every
row by all slots' A stacked while those are few rows (``STACKED_A_ROWS``: a few small ops cost more than the
wasted multiplications), else one per adapter too. The deltas are summed in the adapters' dtype and added
to the base's result once.

Where the platform has a kernel for it (``Platform.lora_op``: the C++ library's ``lora_add`` on the CPU from
avx2 on, switch ``FOLOVLLM_CPU_LORA_KERNEL``; its Triton form on CUDA, platforms/triton_ops/lora.py), each
linear makes one call for all its rows instead: every row multiplies its own adapter's A and B only, in fp32,
from tables built here when a slot changes (``kernel_tables``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from folovllm.lora.adapter import LinearLoRA
from folovllm.model.quantization.linear_method import LinearMethod

Rows = slice | torch.Tensor  # a run of consecutive rows, or their indices
# lora_add(out, x, row_slot, a, a_start, b, pieces, p_start): out += each row's adapter delta, in place
LoRAOp = Callable[..., None]
STACKED_A_ROWS = 256  # up to this many A rows over all slots, every row is multiplied by all of them at once


@dataclass
class LoRABatch:
    """A step's rows by adapter slot: (slot, its rows) for each slot some row uses; empty: no adapter."""

    segments: list[tuple[int, Rows]] = field(default_factory=list)
    row_slot: torch.Tensor | None = None  # int64 [rows]: each row's slot, -1 for none (the kernel form's)

    @classmethod
    def from_row_slots(cls, row_slots: list[int], device: torch.device | str = "cpu") -> LoRABatch:
        """From each row's slot (-1: the base model alone); row indices on ``device``."""
        by_slot: dict[int, list[int]] = {}
        for row, slot in enumerate(row_slots):
            if slot >= 0:
                by_slot.setdefault(slot, []).append(row)
        segments: list[tuple[int, Rows]] = []
        for slot, rows in by_slot.items():
            if rows[-1] - rows[0] + 1 == len(rows):
                segments.append((slot, slice(rows[0], rows[-1] + 1)))
            else:
                segments.append((slot, torch.tensor(rows, dtype=torch.int64, device=device)))
        return cls(segments, torch.tensor(row_slots, dtype=torch.int64, device=device) if segments else None)


def kernel_tables(slots: list[LinearLoRA | None]) -> tuple[torch.Tensor, ...]:
    """The kernel's tables for one linear's slots (csrc/cpu/lora.cpp): A [R, in] fp32, a_start [slots + 1],
    b (each piece's B transposed, flat), pieces [P, 5] (A rows, outputs, offset in b), p_start [slots + 1];
    () where no slot adapts this linear."""
    if all(weights is None for weights in slots):
        return ()
    a_parts, b_parts, pieces = [], [], []
    a_start, p_start, rows, offset = [0], [0], 0, 0
    for weights in slots:
        if weights is not None:
            a, bs = weights
            a_parts.append(a.float())
            for piece in bs:
                rank, width = piece.weight.shape[1], piece.weight.shape[0]
                b_parts.append(piece.weight.float().t().reshape(-1))
                pieces.append([rows + piece.column, rows + piece.column + rank, piece.row, piece.row + width, offset])
                offset += rank * width
            rows += a.shape[0]
        a_start.append(rows)
        p_start.append(len(pieces))
    device = a_parts[0].device

    def index(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)
    return (torch.cat(a_parts).contiguous(), index(a_start), torch.cat(b_parts).contiguous(),
            index(pieces).reshape(-1, 5), index(p_start))


class LoRALinearMethod(LinearMethod):
    """One layer's base method plus its adapters' weights per slot (None: that slot's adapter leaves this
    linear alone). Created over a loaded layer (``create_weights`` is the base's, never called again).
    ``kernel``: the platform's lora_add op (adapters in fp32); None: the torch form."""

    fusable = False  # a compiled form must call this method, not the base kernel it wraps

    def __init__(self, base: LinearMethod, max_loras: int, batch: LoRABatch, kernel: LoRAOp | None = None) -> None:
        self.base = base
        self.slots: list[LinearLoRA | None] = [None] * max_loras
        self.batch = batch  # shared by every adapted linear of the model; the manager sets it each step
        self.kernel = kernel
        self._stacked: tuple[torch.Tensor, dict[int, tuple[int, int]]] | None = None  # all slots' A, each's columns
        self._tables: tuple[torch.Tensor, ...] | None = None  # the kernel's (kernel_tables)

    def set_slot(self, slot: int, weights: LinearLoRA | None) -> None:
        """Slot ``slot`` now holds these (A, B pieces) (None: its adapter leaves this linear alone)."""
        self.slots[slot] = weights
        self._stacked = self._tables = None

    def _stacked_a(self) -> tuple[torch.Tensor, dict[int, tuple[int, int]]]:
        if self._stacked is None:
            parts, columns, start = [], {}, 0
            for slot, weights in enumerate(self.slots):
                if weights is not None:
                    parts.append(weights[0])
                    columns[slot] = (start, start + weights[0].shape[0])
                    start += weights[0].shape[0]
            self._stacked = (torch.cat(parts), columns)
        return self._stacked

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, bias: bool,
                       dtype: torch.dtype, device: torch.device) -> None:
        self.base.create_weights(layer, input_size, output_size, bias, dtype, device)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.base.process_weights_after_loading(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.add_deltas(x, self.base.apply(layer, x, bias))

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        base, add = self.base.bind(layer, bias), self.add_deltas
        return lambda x: add(x, base(x))

    def add_deltas(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the base's result, written in place) plus each row's adapter delta, computed in the
        adapters' dtype."""
        if self.kernel is not None:
            if self._tables is None:
                self._tables = kernel_tables(self.slots)
            if self.batch.row_slot is not None and self._tables:
                self.kernel(out, x, self.batch.row_slot, *self._tables)
            return out
        segments = [(slot, rows) for slot, rows in self.batch.segments if self.slots[slot] is not None]
        if not segments:
            return out
        a_all, columns = self._stacked_a()
        x = x.to(a_all.dtype)
        xa_all = x.mm(a_all.t()) if a_all.shape[0] <= STACKED_A_ROWS else None
        delta = out if out.dtype == a_all.dtype else torch.zeros(out.shape, dtype=a_all.dtype, device=out.device)
        for slot, rows in segments:
            a, pieces = self.slots[slot]
            if xa_all is not None:
                start, end = columns[slot]
                xa = xa_all[rows, start:end]
            else:
                xa = x[rows].mm(a.t())
            for piece in pieces:
                b = piece.weight
                part = xa[:, piece.column:piece.column + b.shape[1]]
                outputs = slice(piece.row, piece.row + b.shape[0])
                if isinstance(rows, slice):
                    delta[rows, outputs].addmm_(part, b.t())
                else:
                    delta[:, outputs].index_add_(0, rows, part.mm(b.t()))
        if delta is not out:
            out += delta
        return out


def adapted_linears(model: nn.Module) -> dict[tuple[int, str], nn.Module]:
    """The linears an adapter may target, by (decoder layer index, our linear's name)."""
    layers = model.model.layers
    found: dict[tuple[int, str], nn.Module] = {}
    for index, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        for name, owner in (("qkv_proj", attn), ("o_proj", attn), ("gate_up_proj", mlp), ("down_proj", mlp)):
            linear = getattr(owner, name, None)
            if linear is None:
                raise ValueError(f"LoRA: decoder layer {index} has no {name}; this architecture cannot take adapters")
            found[(index, name)] = linear
    return found
