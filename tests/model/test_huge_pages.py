"""Weights moved into one huge-page block (``FOLOVLLM_HUGE_PAGE_WEIGHTS``): the same tensors, values and
sharing, and the same model outputs with the switch on and off."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from folovllm.platforms.allocator import find_tcmalloc
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


_RESIDENT_GROWTH = """
import torch
from torch import nn
from folovllm.platforms.allocator import loaded_allocator
from folovllm.platforms.huge_pages import move_weights_to_huge_pages

def anon_mib():
    line = next(x for x in open("/proc/self/status") if x.startswith("RssAnon:"))
    return int(line.split()[1]) / 1024

module = nn.Module()
for i in range(32):  # 128 MiB of weights, each its own heap block
    module.register_buffer(f"w{i}", torch.ones(4 << 20, dtype=torch.uint8))
before = anon_mib()
move_weights_to_huge_pages(module)
print(loaded_allocator(), anon_mib() - before)
"""


@pytest.mark.skipif(sys.platform != "linux" or find_tcmalloc() is None, reason="no tcmalloc installed")
def test_moved_weights_stay_resident_once_under_tcmalloc() -> None:
    """tcmalloc keeps freed spans, where glibc's malloc_trim does not reach: the old copies must still go
    back to the OS, or a model stays resident twice (its weights moved, and the copies they left)."""
    env = {**os.environ, "LD_PRELOAD": find_tcmalloc(), "FOLOVLLM_CPU_ALLOCATOR": "tcmalloc"}
    done = subprocess.run([sys.executable, "-c", _RESIDENT_GROWTH], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    allocator, growth_mib = done.stdout.split()
    assert allocator == "tcmalloc"
    assert float(growth_mib) < 32, f"resident memory grew {growth_mib} MiB moving 128 MiB of weights"
