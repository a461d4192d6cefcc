"""The batched op alone: each row gets its own slot's x·Aᵀ·Bᵀ on its pieces' outputs (rows interleaved or
side by side, A stacked or per adapter, a bf16 base result), rows with no adapter get nothing."""
from __future__ import annotations

import pytest
import torch

from folovllm.lora import layers
from folovllm.lora.adapter import BPiece
from folovllm.lora.layers import LoRABatch, LoRALinearMethod
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod

OUTS = [8, 4, 4]  # a merged q/k/v-like linear


def slot_weights(gen: torch.Generator, rank: int, pieces: list[int]):
    a = torch.randn(rank * len(pieces), 6, generator=gen)
    return a, tuple(BPiece(sum(OUTS[:p]), j * rank, torch.randn(OUTS[p], rank, generator=gen))
                    for j, p in enumerate(pieces))


def reference(x: torch.Tensor, weights) -> torch.Tensor:
    a, pieces = weights
    full = torch.zeros(sum(OUTS), a.shape[0])
    for p in pieces:
        full[p.row:p.row + p.weight.shape[0], p.column:p.column + p.weight.shape[1]] = p.weight
    return x @ a.t() @ full.t()


@pytest.mark.parametrize("row_slots", [[0, 1, 0, -1, 1, 2], [-1, 0, 0, 1, 1, 2]])
@pytest.mark.parametrize("stacked_rows", [0, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_gets_its_slots_delta(row_slots, stacked_rows, dtype, monkeypatch) -> None:
    monkeypatch.setattr(layers, "STACKED_A_ROWS", stacked_rows)
    gen = torch.Generator().manual_seed(0)
    method = LoRALinearMethod(UnquantizedLinearMethod(), 4, LoRABatch.from_row_slots(row_slots))
    weights = [slot_weights(gen, 2, [0, 2]), slot_weights(gen, 3, [0, 1, 2]), None]
    for slot, w in enumerate(weights):
        method.set_slot(slot, w)
    x = torch.randn(len(row_slots), 6, generator=gen)
    base = torch.randn(len(row_slots), sum(OUTS), generator=gen)
    got = method.add_deltas(x.to(dtype), base.clone().to(dtype)).float()
    for row, slot in enumerate(row_slots):
        w = weights[slot] if slot >= 0 else None
        expected = base[row] + (reference(x[row:row + 1], w)[0] if w is not None else 0)
        tol = 1e-5 if dtype == torch.float32 else 5e-2
        torch.testing.assert_close(got[row], expected.to(dtype).float(), rtol=tol, atol=tol)


def test_segments_are_slices_when_rows_are_side_by_side() -> None:
    segments = LoRABatch.from_row_slots([-1, 0, 0, 3, 3, 3]).segments
    assert segments == [(0, slice(1, 3)), (3, slice(3, 6))]
    interleaved = LoRABatch.from_row_slots([0, 1, 0]).segments
    assert isinstance(interleaved[0][1], torch.Tensor) and interleaved[1] == (1, slice(1, 2))
