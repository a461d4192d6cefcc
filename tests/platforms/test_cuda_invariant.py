"""CUDA's batch-invariant forms (platforms/cuda_invariant.py), rehearsed in Triton's interpreter on CPU tensors:
a row's GEMM outputs, softmax, log-softmax and mean are the same bits however many rows come with it, and
close to torch's; registered over aten's kernels they are what mm, F.linear, log_softmax and RMSNorm's mean
run (in a process of its own, on the CPU key)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import use_triton_interpreter_without_cuda

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (the test extra pins it on x86-64 Linux)", allow_module_level=True)
use_triton_interpreter_without_cuda()

from folovllm.platforms import cuda_invariant  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_rows_do_not_depend_on_the_batch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 80, generator=gen).to(dtype)  # [out, in]: K = 80 is no multiple of BLOCK_K
    bias = torch.randn(96, generator=gen).to(dtype)
    x = torch.randn(130, 80, generator=gen).to(dtype)
    needle = cuda_invariant.addmm(bias, x[3:4], weight.t())
    alone = cuda_invariant.mm(x[3:4], weight.t())
    for rows in (4, 64, 65, 130):  # part of a tile, a full tile, a tile and one row, three tiles
        assert torch.equal(cuda_invariant.addmm(bias, x[:rows], weight.t())[3], needle[0])
        assert torch.equal(cuda_invariant.mm(x[:rows], weight.t())[3], alone[0])
    batched = cuda_invariant.bmm(x[:64].view(4, 16, 80), weight.t().expand(4, 80, 96))
    assert torch.equal(batched[0, 3], alone[0])
    tolerance = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.02)
    torch.testing.assert_close(cuda_invariant.addmm(bias, x, weight.t(), beta=0.5, alpha=2.0),
                               torch.addmm(bias, x, weight.t(), beta=0.5, alpha=2.0), **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_reductions_do_not_depend_on_the_batch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(9, 2500, generator=gen) * 3).to(dtype)  # rows longer than one chunk
    for fn, theirs in ((cuda_invariant.log_softmax, torch.log_softmax), (cuda_invariant.softmax, torch.softmax)):
        ours = fn(x, -1, False)
        assert torch.equal(fn(x[4:5], 1, False)[0], ours[4])
        torch.testing.assert_close(ours.float(), theirs(x.float(), -1), atol=1e-5, rtol=1e-2 if dtype != torch.float32 else 1e-5)
    assert fn(x, -1, True).dtype == torch.float32
    torch.testing.assert_close(cuda_invariant.softmax(x[:, :30].float(), 0, False), torch.softmax(x[:, :30].float(), 0))
    mean = cuda_invariant.mean_dim(x, [-1], True)
    assert mean.shape == (9, 1) and torch.equal(cuda_invariant.mean_dim(x[4:5], [1])[0], mean[4, 0])
    torch.testing.assert_close(mean.float(), x.float().mean(-1, keepdim=True), atol=1e-3, rtol=1e-2)
    weight = torch.randn(2500, generator=gen).to(dtype)
    normed, rstd = cuda_invariant.fused_rms_norm(x, [2500], weight, 1e-6)
    assert rstd.shape == (9, 1) and torch.equal(cuda_invariant.fused_rms_norm(x[4:5], [2500], weight, 1e-6)[0][0], normed[4])
    theirs, their_rstd = torch.ops.aten._fused_rms_norm(x, [2500], weight, 1e-6)
    torch.testing.assert_close(normed.float(), theirs.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(rstd, their_rstd, atol=1e-5, rtol=1e-4)
    cube = torch.randn(3, 4, 5, generator=gen)
    torch.testing.assert_close(cuda_invariant.mean_dim(cube, [0, 2]), cube.mean((0, 2)))
    torch.testing.assert_close(cuda_invariant.mean_dim(cube, None, dtype=torch.float64), cube.double().mean())


def test_registered_over_aten_they_are_what_torch_runs() -> None:
    script = """
import torch, torch.nn.functional as F
from tests.helpers import use_triton_interpreter_without_cuda
use_triton_interpreter_without_cuda()
from folovllm.platforms import cuda_invariant
cuda_invariant.enable("CPU")
cuda_invariant.enable("CPU")  # once per process
w, x = torch.randn(70, 48), torch.randn(40, 48)
assert torch.equal(F.linear(x, w)[5], F.linear(x[5:6], w)[0])
assert torch.equal(F.linear(x, w, torch.ones(70)), cuda_invariant.addmm(torch.ones(70), x, w.t()))
assert torch.equal(torch.log_softmax(x, -1), cuda_invariant.log_softmax(x, -1, False))
assert torch.equal(x.pow(2).mean(-1, keepdim=True), cuda_invariant.mean_dim(x.pow(2), [-1], True))
assert torch.equal(F.rms_norm(x, (48,), eps=1e-6), cuda_invariant.fused_rms_norm(x, [48], None, 1e-6)[0])
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
