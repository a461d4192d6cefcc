"""The batched op alone: each row gets its own slot's x·Aᵀ·Bᵀ on its pieces' outputs (rows interleaved or
side by side, A stacked or per adapter, a bf16 base result), rows with no adapter get nothing; the same from
the CPU kernel (``lora_add``) at each tier, against the torch form."""
from __future__ import annotations

import pytest
import torch

from folovllm.lora import layers
from folovllm.lora.adapter import BPiece
from folovllm.lora.layers import LoRABatch, LoRALinearMethod
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod
from tests.lora.adapters import adapted_forms, cpu_lora_add
from tests.tiers import skip_unless_kernel

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
@pytest.mark.parametrize("form", ["torch", "torch-stacked", "kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_gets_its_slots_delta(row_slots, form, dtype, monkeypatch) -> None:
    monkeypatch.setattr(layers, "STACKED_A_ROWS", 256 if form == "torch-stacked" else 0)
    if form == "kernel":
        skip_unless_kernel("lora")
    gen = torch.Generator().manual_seed(0)
    method = LoRALinearMethod(UnquantizedLinearMethod(), 4, LoRABatch.from_row_slots(row_slots),
                              cpu_lora_add if form == "kernel" else None)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_the_torch_form_at_each_tier(kernel_tier: str, dtype: torch.dtype) -> None:
    """Model-sized rows: runs of one slot longer than the kernel's block of 8, ranks 4 to 64, a slot that
    leaves the linear alone, base rows between; outputs whose width is no multiple of a vector's lanes."""
    gen = torch.Generator().manual_seed(1)
    in_features, outs = 72, [40, 24, 24]
    row_slots = [0] * 11 + [-1, 1, 1, 2, 3, 3, -1] + [4] * 9 + [1]
    forms = adapted_forms(gen, row_slots, in_features, outs, [(8, [0, 1, 2]), (4, [1]), (64, [0, 2]), None, (16, [2])])
    x = torch.randn(len(row_slots), in_features, generator=gen).to(dtype)
    base = torch.randn(len(row_slots), sum(outs), generator=gen).to(dtype)
    expected = forms[0].add_deltas(x.float(), base.float().clone())
    got = forms[1].add_deltas(x, base.clone())
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected.to(dtype).float(), rtol=1e-5 if dtype == torch.float32 else 1e-2,
                               atol=1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(got[11], base[11]) and torch.equal(got[15], base[15])  # no adapter, slot 3 adapts nothing
