"""The Triton form of the LoRA op (platforms/triton_ops/lora.py) against the torch form: on CUDA when present,
else through Triton's interpreter on CPU tensors.

Shapes stay small: on CPU every Triton program runs in Python (numpy), one program at a time."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from folovllm.lora.adapter import BPiece
from folovllm.lora.layers import LoRABatch, kernel_tables
from tests.helpers import use_triton_interpreter_without_cuda
from tests.lora.adapters import adapted_forms

if importlib.util.find_spec("triton") is None:  # not importorskip: triton must not be imported yet
    pytest.skip("triton is not installed (the test extra pins it on x86-64 Linux)", allow_module_level=True)
use_triton_interpreter_without_cuda()  # before the kernel's module is imported anywhere

from folovllm.platforms.triton_ops.lora import lora_add  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_form_equals_the_torch_form(dtype: torch.dtype) -> None:
    """Rows interleaved among slots, base rows between; ranks 4 to 64 (several rank blocks of the kernel); q/k/v-like
    pieces whose widths are no multiple of the kernel's BLOCK_N (one crosses a tile edge); a slot with no weights
    for this linear."""
    gen = torch.Generator().manual_seed(1)
    in_features, outs = 72, [40, 30, 30]  # 100 outputs: two tiles of 64, the second piece across the edge
    row_slots = [0, 1, 0, -1, 2, 3, 4, -1, 1, 4, 0, 3]
    torch_form, _ = adapted_forms(gen, row_slots, in_features, outs,
                                  [(8, [0, 1, 2]), (4, [1]), (64, [0, 2]), None, (20, [2])])
    x = torch.randn(len(row_slots), in_features, generator=gen).to(dtype)
    base = torch.randn(len(row_slots), sum(outs), generator=gen).to(dtype)
    expected = torch_form.add_deltas(x.float(), base.float().clone())
    got = base.to(DEVICE, copy=True)
    tables = [t.to(DEVICE) for t in kernel_tables(torch_form.slots)]
    lora_add(got, x.to(DEVICE), torch.tensor(row_slots, device=DEVICE), *tables)
    got = got.cpu()
    assert got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), expected.to(dtype).float(), rtol=tolerance, atol=tolerance)
    for row in (3, 7, 5):  # no adapter, and slot 3 adapts nothing here: bit for bit the base
        assert torch.equal(got[row], base[row])
    second = slice(outs[0], outs[0] + outs[1])  # slot 1 adapts only the second piece's outputs
    assert torch.equal(got[1, :outs[0]], base[1, :outs[0]]) and torch.equal(got[1, second.stop:], base[1, second.stop:])
    assert not torch.equal(got[1, second], base[1, second])


def test_the_linear_method_takes_the_platforms_op() -> None:
    """The method calls whichever op it is given (the CUDA platform's ``lora_op`` is this one): the same deltas
    as the torch form."""
    gen = torch.Generator().manual_seed(3)
    row_slots = [0, -1, 1, 0]
    torch_form, kernel_form = adapted_forms(gen, row_slots, 24, [16, 8], [(8, [0, 1]), (4, [0])], kernel=lora_add)
    for method in (kernel_form, torch_form):
        method.batch = LoRABatch.from_row_slots(row_slots, DEVICE)
        for slot, weights in enumerate(method.slots):
            if weights is not None:
                a, pieces = weights
                method.set_slot(slot, (a.to(DEVICE), tuple(BPiece(p.row, p.column, p.weight.to(DEVICE))
                                                           for p in pieces)))
    x = torch.randn(4, 24, generator=gen).to(DEVICE)
    base = torch.randn(4, 24, generator=gen).to(DEVICE)
    got = kernel_form.add_deltas(x, base.clone())
    torch.testing.assert_close(got, torch_form.add_deltas(x, base.clone()), rtol=1e-4, atol=1e-4)
