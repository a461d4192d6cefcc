"""Our CPU W4A16 kernel (csrc/cpu_quant_gemm.cpp): the 4-bit codes repacked once into its layout.

The kernel computes y = x W^T with w[n, k] = (q[n, k] - 8) * scale[n, g] + zero[n, g] for groups of
``group_size`` inputs (the last one may be partial), from bf16 or fp32 activations; the output size
must be a multiple of 16, the input size and the group size multiples of 8. It unpacks codes in registers and applies
each group's scale and zero once per output (see the source's header for the layout and the identity).
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

CPU_QUANT_GEMM_LIBRARY = (Path(__file__).resolve().parents[3] / "build" / "cpu_quant_gemm"
                          / "libfolovllm_cpu_quant_gemm.so")
BLOCK_COLS = 16  # output columns per packed block
CHUNK_K = 8  # codes per uint32 lane
ACTIVATION_DTYPES = (torch.bfloat16, torch.float32)


@functools.cache
def cpu_int4_unavailable(path: Path = CPU_QUANT_GEMM_LIBRARY) -> str | None:
    """Why our int4 kernel cannot run in this process (not built, does not load, CPU lacks AVX512_BF16), or None."""
    if not path.is_file():
        return f"the CPU int4 kernel is not built ({path} is missing): run `make kernels` in the source tree"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return f"the CPU int4 kernel {path} does not load ({exc}): rebuild it with `make kernels`"
    if not torch.ops.folovllm_cpu_quant.supported():
        return "this CPU lacks AVX512_BF16, which the CPU int4 kernel needs"
    return None


def cpu_int4_fits(input_size: int, output_size: int, group_size: int, dtype: torch.dtype) -> bool:
    """Whether our kernel takes a [output_size x input_size] layer with these groups and activations."""
    return (dtype in ACTIVATION_DTYPES and output_size % BLOCK_COLS == 0 and input_size % CHUNK_K == 0
            and group_size > 0 and group_size % CHUNK_K == 0)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in [0, 16) -> int32 [N / 16, K / 8, 16]: lane j of chunk c holds column j's codes
    8c + 2p at bits 4p and 8c + 2p + 1 at bits 16 + 4p (p = 0..3)."""
    n, k = codes.shape
    q = codes.to(torch.int64).reshape(n // BLOCK_COLS, BLOCK_COLS, k // CHUNK_K, 4, 2)
    shifts = 4 * torch.arange(4).view(4, 1) + torch.tensor([0, 16]).view(1, 2)
    words = (q << shifts).sum(dim=(-2, -1))  # disjoint bit fields: the sum is the bitwise or
    words = torch.where(words >= 2**31, words - 2**32, words)  # the same 32 bits as a signed int32
    return words.to(torch.int32).transpose(1, 2).contiguous()


def pack_groups(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, groups] -> [N / 16, groups, 16] in ``dtype`` (each column block's groups contiguous)."""
    n, groups = values.shape
    return values.to(dtype).reshape(n // BLOCK_COLS, BLOCK_COLS, groups).transpose(1, 2).contiguous()


class CpuInt4Kernel(nn.Module):
    """One or more of our int4 matmuls summed (several: the nibbles of 8-bit codes), after an optional
    permutation of x's columns (act-order). Activations in another dtype than bf16/fp32 go through fp32."""

    def __init__(self, codes: list[torch.Tensor], scales: list[torch.Tensor], zeros: list[torch.Tensor],
                 group_size: int, dtype: torch.dtype, perm: torch.Tensor | None) -> None:
        super().__init__()
        reason = cpu_int4_unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        self.group_size, self.num_parts = group_size, len(codes)
        for i, (q, s, z) in enumerate(zip(codes, scales, zeros)):
            self.register_buffer(f"codes{i}", pack_int4(q))  # q [out, in] in [0, 16)
            self.register_buffer(f"scales{i}", pack_groups(s, dtype))  # [out, in / group_size]
            self.register_buffer(f"zeros{i}", pack_groups(z, dtype))
        self.register_buffer("perm", perm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        y = None
        for i in range(self.num_parts):
            part = torch.ops.folovllm_cpu_quant.int4_gemm(
                x, getattr(self, f"codes{i}"), getattr(self, f"scales{i}"), getattr(self, f"zeros{i}"),
                self.group_size)
            y = part if y is None else y + part
        return y
