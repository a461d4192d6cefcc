"""Weights moved into one huge-page block (``FOLOVLLM_HUGE_PAGE_WEIGHTS``): the same tensors, values and
sharing, and the same model outputs with the switch on and off."""
from __future__ import annotations

import torch
from torch import nn

from folovllm.platforms.huge_pages import move_weights_to_huge_pages
from tests.helpers import cpu_model
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (a fixture)


def test_tensors_keep_identity_values_and_sharing() -> None:
    gen = torch.Generator().manual_seed(0)
    module = nn.Module()
    module.a = nn.Linear(64, 48).bfloat16()
    module.b = nn.Linear(48, 64)
    module.b.weight = nn.Parameter(module.a.weight.t().float())  # a plain copy, its own storage
    shared = torch.randint(-2**31, 2**31, (100,), dtype=torch.int32, generator=gen)
    module.register_buffer("whole", shared)
    module.register_buffer("part", shared[10:30])  # a view: it must stay a view of the moved storage
    module.tied = module.a.weight  # the same Parameter twice
    before = {name: t.clone() for name, t in (*module.named_parameters(), *module.named_buffers())}
    ids = {name: id(t) for name, t in (*module.named_parameters(), *module.named_buffers())}
    moved = move_weights_to_huge_pages(module)
    assert moved >= sum(p.numel() * p.element_size() for p in module.parameters()) + shared.numel() * 4
    for name, t in (*module.named_parameters(), *module.named_buffers()):
        assert id(t) == ids[name] and torch.equal(t, before[name])
    assert module.part.untyped_storage().data_ptr() == module.whole.untyped_storage().data_ptr()
    module.whole[15] = 7  # still one storage: a write shows through the view
    assert module.part[5].item() == 7
    assert module.tied is module.a.weight
    ptrs = [t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())]
    assert len(set(ptrs)) == 1  # all in the one block


def test_model_outputs_unchanged(tiny_llama, tmp_path) -> None:  # noqa: F811
    """A GPTQ model with an int8 head (the kernels' packed buffers, the compiled forms' bound tensors)."""
    gptq, _ = make_gptq_model(tiny_llama, tmp_path)
    hidden = None
    logits = []
    for switch in ("on", "off"):
        model = cpu_model(gptq, torch.bfloat16, {"HUGE_PAGE_WEIGHTS": switch}, quantize_lm_head="on")
        if hidden is None:
            hidden = torch.randn(5, model.arch.hidden_size).bfloat16()
        layer = model.model.layers[0].mlp
        with torch.no_grad():
            logits.append((model.compute_logits(hidden), layer(hidden)))
    assert torch.equal(logits[0][0], logits[1][0]) and torch.equal(logits[0][1], logits[1][1])


def test_freed_storages_go_back_to_the_os(monkeypatch) -> None:
    """Each storage of TRIM_BYTES or more that moved is followed by one malloc_trim, so the heap holes the
    old copies leave do not stay resident; smaller ones are not."""
    from folovllm.platforms import huge_pages

    calls = []
    monkeypatch.setattr(huge_pages, "_release_freed_memory", lambda: calls.append(1))
    module = nn.Module()
    module.register_buffer("big", torch.zeros(huge_pages.TRIM_BYTES, dtype=torch.uint8))
    module.register_buffer("big_view", module.big[8:])  # shares the big storage: moved (and trimmed) once
    module.register_buffer("small", torch.zeros(100))
    move_weights_to_huge_pages(module)
    assert len(calls) == 1
