"""The worker's adapters: a CPU pool of loaded adapters (LRU, ``max_cpu_loras``) and ``max_loras`` slots that
the model's adapted linears read (LRU over the slots not used by the current step).

``add`` loads and checks an adapter into the pool (the engine calls it when a request arrives, so a bad
adapter fails that request alone, before it is queued); ``set_batch`` puts a step's adapters into slots
(loading from disk again only if the pool evicted one meanwhile) and groups the step's rows by slot.
"""
from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from folovllm.lora.adapter import LinearLoRA, LoRAAdapter, load_adapter
from folovllm.lora.layers import LoRABatch, LoRALinearMethod, LoRAOp, adapted_linears
from folovllm.lora.request import LoRARequest
from folovllm.model.arch import ArchConfig


class LoRAManager:
    """Adapters for one model (see the module doc); ``attach`` wraps its linears first."""

    def __init__(self, model: nn.Module, max_loras: int, max_lora_rank: int, max_cpu_loras: int,
                 dtype: torch.dtype, kernel: LoRAOp | None = None) -> None:
        """``dtype``: the adapters' matmuls (the platform's ``small_matmul_dtype`` of the model's); ``kernel``:
        the platform's lora_add op (``Platform.lora_op``), which adds the deltas from fp32 adapters."""
        self.arch: ArchConfig = model.arch
        self.max_loras, self.max_lora_rank, self.max_cpu_loras = max_loras, max_lora_rank, max_cpu_loras
        self.device = next(model.parameters()).device
        self.dtype = torch.float32 if kernel is not None else dtype
        self.batch = LoRABatch()
        self.linears: dict[tuple[int, str], LoRALinearMethod] = {}
        for key, linear in adapted_linears(model).items():
            method = LoRALinearMethod(linear.method, max_loras, self.batch, kernel)
            linear.method = method
            self.linears[key] = method
        self.pool: OrderedDict[int, LoRAAdapter] = OrderedDict()  # int id -> adapter, least recent first
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # int id -> slot, least recent first
        self.load_seconds: dict[int, float] = {}  # each adapter's last load from disk (bench lora reports it)

    def add(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter in the pool, loaded and checked if it is not there (ValueError naming what does not fit)."""
        adapter = self.pool.get(request.lora_int_id)
        if adapter is not None:
            if adapter.request.lora_path != request.lora_path or adapter.request.lora_name != request.lora_name:
                raise ValueError(f"lora_int_id {request.lora_int_id} is already adapter "
                                 f"{adapter.request.lora_name!r} at {adapter.request.lora_path!r}; "
                                 "give each adapter its own id")
            self.pool.move_to_end(request.lora_int_id)
            return adapter
        start = time.perf_counter()
        adapter = load_adapter(request, self.arch, self.max_lora_rank)
        self.load_seconds[request.lora_int_id] = time.perf_counter() - start
        self.pool[request.lora_int_id] = adapter
        while len(self.pool) > self.max_cpu_loras:
            self.pool.popitem(last=False)
        return adapter

    def remove(self, lora_int_id: int) -> bool:
        """Drops an adapter from the pool and its slot; whether it was there."""
        found = self.pool.pop(lora_int_id, None) is not None
        slot = self.slot_of.pop(lora_int_id, None)
        if slot is not None:
            for method in self.linears.values():
                method.set_slot(slot, None)
        return found or slot is not None

    def list_loras(self) -> list[int]:
        return list(self.pool)

    def set_batch(self, row_adapters: Sequence[tuple[LoRARequest | None, int]]) -> None:
        """The step's rows by slot: ``row_adapters`` lists each request's adapter (None: the base model) and
        its number of rows, in batch order."""
        wanted = {r.lora_int_id: r for r, _ in row_adapters if r is not None}
        if len(wanted) > self.max_loras:
            raise RuntimeError(f"a step uses {len(wanted)} adapters, more than max_loras={self.max_loras} "
                               "(the scheduler keeps them apart)")
        slots = {lora_id: self._slot(request, wanted) for lora_id, request in wanted.items()}
        row_slots: list[int] = []
        for request, rows in row_adapters:
            row_slots.extend([-1 if request is None else slots[request.lora_int_id]] * rows)
        step = LoRABatch.from_row_slots(row_slots if wanted else [], self.device)
        self.batch.segments, self.batch.row_slot = step.segments, step.row_slot

    def _slot(self, request: LoRARequest, in_step: dict[int, LoRARequest]) -> int:
        """The adapter's slot, filled now if it has none (the least recently used slot not in this step)."""
        lora_id = request.lora_int_id
        slot = self.slot_of.get(lora_id)
        if slot is not None:
            self.slot_of.move_to_end(lora_id)
            return slot
        used = set(self.slot_of.values())
        free = [s for s in range(self.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next(i for i in self.slot_of if i not in in_step)
            slot = self.slot_of.pop(victim)
        adapter = self.add(request)
        for key, method in self.linears.items():
            weights = adapter.weights.get(key)
            method.set_slot(slot, None if weights is None else self._placed(weights))
        self.slot_of[lora_id] = slot
        return slot

    def _placed(self, weights: LinearLoRA) -> LinearLoRA:
        """An adapter's weights for one linear on the model's device, in the adapters' dtype."""
        a, pieces = weights
        return (a.to(self.device, self.dtype).contiguous(),
                tuple(dataclasses.replace(p, weight=p.weight.to(self.device, self.dtype).contiguous()) for p in pieces))

    @property
    def slot_ids(self) -> list[int]:
        """The adapters in slots now, least recently used first."""
        return list(self.slot_of)

