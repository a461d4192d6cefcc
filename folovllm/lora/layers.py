"""The batched LoRA op in the linear-method seam: a method that wraps the layer's own (plain, packed, GPTQ,
int8) and adds, to each row of a step, its adapter's ``x·Aᵀ·Bᵀ`` (scale folded into B).

Rows are grouped by adapter slot once per step (``LoRABatch``, set by the worker's ``LoRAManager`` from the
step's requests); each linear then runs two small matmuls per adapter present in the batch over that
adapter's rows: the work is the rows' own rank, not every slot's, and rows with no adapter cost nothing.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from folovllm.model.quantization.linear_method import LinearMethod

Rows = slice | torch.Tensor  # a run of consecutive rows, or their indices


@dataclass
class LoRABatch:
    """A step's rows by adapter slot: (slot, its rows) for each slot some row uses; empty: no adapter."""

    segments: list[tuple[int, Rows]] = field(default_factory=list)

    @classmethod
    def from_row_slots(cls, row_slots: list[int]) -> LoRABatch:
        """From each row's slot (-1: the base model alone)."""
        by_slot: dict[int, list[int]] = {}
        for row, slot in enumerate(row_slots):
            if slot >= 0:
                by_slot.setdefault(slot, []).append(row)
        segments: list[tuple[int, Rows]] = []
        for slot, rows in by_slot.items():
            if rows[-1] - rows[0] + 1 == len(rows):
                segments.append((slot, slice(rows[0], rows[-1] + 1)))
            else:
                segments.append((slot, torch.tensor(rows, dtype=torch.int64)))
        return cls(segments)


class LoRALinearMethod(LinearMethod):
    """One layer's base method plus its adapters' weights per slot (None: that slot's adapter leaves this
    linear alone). Created over a loaded layer (``create_weights`` is the base's, never called again)."""

    fusable = False  # a compiled form must call this method, not the base kernel it wraps

    def __init__(self, base: LinearMethod, max_loras: int, batch: LoRABatch) -> None:
        self.base = base
        self.slots: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * max_loras
        self.batch = batch  # shared by every adapted linear of the model; the manager sets it each step

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
        for slot, rows in self.batch.segments:
            weights = self.slots[slot]
            if weights is None:
                continue
            a, b = weights
            if isinstance(rows, slice):
                xs = x[rows].to(a.dtype)
                if out.dtype == a.dtype:
                    out[rows].addmm_(xs.mm(a.t()), b.t())
                else:
                    out[rows] += xs.mm(a.t()).mm(b.t())
            else:
                delta = x.index_select(0, rows).to(a.dtype).mm(a.t()).mm(b.t())
                out.index_add_(0, rows, delta.to(out.dtype))
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
