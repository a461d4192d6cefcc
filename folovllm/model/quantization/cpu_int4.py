"""Our CPU weight-only quantized matmuls (csrc/cpu/quant_gemm.cpp): the codes repacked once into their layouts.

- ``int4_gemm`` (``CpuInt4Kernel``): y = x W^T with w[n, k] = (q[n, k] - 8) * scale[n, g] + zero[n, g] for
  groups of ``group_size`` inputs (the last one may be partial); the output size must be a multiple of
  16, the input size and the group size multiples of 8. Codes are unpacked in registers and each
  group's scale and zero applied once per output (csrc/cpu/quant_int4.h has the layout and the identity).
  ``int4_gemm_a8`` is the same product with the activations rounded to int8 per row and group (byte dot
  products: AVX512_VNNI's, else AVX2's two-instruction ones);
  ``LinearKernels.int4_activations`` (``FOLOVLLM_INT4_ACTIVATIONS``: bf16 | int8 | auto, int8 from 16 rows
  on; default bf16) picks between them.
- ``int8_gemm`` (``pack_int8``, used by ``kernels.Int8ChannelKernel``): int8 codes with one scale per
  output; outputs a multiple of 16, inputs of 2.

Both take bf16 or fp32 activations and run from the avx2 tier on (bf16 dot products at avx512_bf16, fp32 FMAs
below it).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from folovllm.model.quantization.op_call import bound_op_call

# What our int4 kernel multiplies the codes with: bf16 activations as they come, or int8, rounded per row
# and weight group and multiplied in byte dot products (fewer instructions per code, one more
# rounding); auto: int8 for calls of at least INT4_A8_MIN_ROWS rows (prefill, large batches), where it
# was measured faster, bf16 below (one stream, where it was not)
INT4_ACTIVATIONS = ("bf16", "int8", "auto")
INT4_A8_MIN_ROWS = 16
BLOCK_COLS = 16  # output columns per packed block
CHUNK_K = 8  # codes per uint32 lane
ACTIVATION_DTYPES = (torch.bfloat16, torch.float32)
NO_A8_ROWS = 2**62  # a row count no call reaches: bf16 activations always


def a8_min_rows(activations: str) -> int:
    """The fewest rows a call needs to take int8 activations under ``activations`` (bf16: never)."""
    return {"int8": 1, "auto": INT4_A8_MIN_ROWS}.get(activations, NO_A8_ROWS)


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


def cpu_int8_fits(input_size: int, output_size: int, dtype: torch.dtype) -> bool:
    """Whether ``int8_gemm`` takes a [output_size x input_size] layer with these activations."""
    return dtype in ACTIVATION_DTYPES and output_size % BLOCK_COLS == 0 and input_size % 2 == 0


def pack_int8(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes [N, K] -> [N / 16, K / 2, 16, 2]: for each 16 columns and input pair, column j's two codes."""
    n, k = codes.shape
    return codes.reshape(n // BLOCK_COLS, BLOCK_COLS, k // 2, 2).transpose(1, 2).contiguous()


def packed_int8_rows(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` of the [N, K] codes that ``pack_int8`` packed (an embedding lookup from a packed head)."""
    pairs = packed.shape[1]
    return packed[rows // BLOCK_COLS, :, rows % BLOCK_COLS, :].reshape(*rows.shape, 2 * pairs)


def pack_groups(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, groups] -> [N / 16, groups, 16] in ``dtype`` (each column block's groups contiguous)."""
    n, groups = values.shape
    return values.to(dtype).reshape(n // BLOCK_COLS, BLOCK_COLS, groups).transpose(1, 2).contiguous()


class CpuInt4Kernel(nn.Module):
    """One or more of our int4 matmuls summed (several: the nibbles of 8-bit codes), after an optional
    permutation of x's columns (act-order); bf16 or fp32 activations, multiplied as they come or rounded to
    int8 (``activations``: bf16, int8 or auto, the platform's ``LinearKernels.int4_activations``)."""

    def __init__(self, codes: list[torch.Tensor], scales: list[torch.Tensor], zeros: list[torch.Tensor],
                 group_size: int, dtype: torch.dtype, perm: torch.Tensor | None,
                 activations: str = "bf16") -> None:
        super().__init__()
        if activations not in INT4_ACTIVATIONS:
            raise ValueError(f"activations must be one of {INT4_ACTIVATIONS}; got {activations!r}")
        self.group_size = group_size
        self.activations = activations
        self.a8_rows = a8_min_rows(self.activations)
        self.part_names = [(f"codes{i}", f"scales{i}", f"zeros{i}") for i in range(len(codes))]
        for (q, s, z), names in zip(zip(codes, scales, zeros), self.part_names):
            self.register_buffer(names[0], pack_int4(q))  # q [out, in] in [0, 16)
            self.register_buffer(names[1], pack_groups(s, dtype))  # [out, in / group_size]
            self.register_buffer(names[2], pack_groups(z, dtype))
        self.register_buffer("perm", perm)

    @property
    def num_parts(self) -> int:
        return len(self.part_names)

    def direct(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward`` as one call of the op where that is all it does (one part; a permutation of x's
        columns with bf16 activations: ``int4_gemm_perm``, the gather and the matmul in one op)."""
        if self.num_parts != 1:
            return self.forward
        ops, group_size, a8_rows = torch.ops.folovllm, self.group_size, self.a8_rows
        codes, scales, zeros = (self._buffers[name] for name in self.part_names[0])
        if self.perm is not None:
            if self.activations != "bf16":
                return self.forward
            return bound_op_call(ops.int4_gemm_perm.default, codes, scales, zeros, group_size, self.perm)
        if self.activations != "auto":  # one op for every call
            op = ops.int4_gemm_a8.default if self.activations == "int8" else ops.int4_gemm.default
            return bound_op_call(op, codes, scales, zeros, group_size)
        a16, a8 = ops.int4_gemm.default, ops.int4_gemm_a8.default
        return lambda x: (a8 if x.numel() >= a8_rows * x.shape[-1] else a16)(x, codes, scales, zeros, group_size)

    def op_for(self, x: torch.Tensor) -> Callable:
        """The op a call on ``x`` runs: int8 activations from ``a8_rows`` rows on."""
        ops = torch.ops.folovllm
        return ops.int4_gemm_a8.default if x.numel() >= self.a8_rows * x.shape[-1] else ops.int4_gemm.default

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buffers = self._buffers  # read directly: this runs ~120 times per decode step
        if buffers["perm"] is not None:
            x = x.index_select(-1, buffers["perm"])
        y, op = None, self.op_for(x)
        for codes, scales, zeros in self.part_names:
            part = op(x, buffers[codes], buffers[scales], buffers[zeros], self.group_size)
            y = part if y is None else y + part
        return y


def fused_int4_mlp(gate_up: nn.Module, down: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``down(silu_and_mul(gate_up(x)))`` as one ``int4_mlp`` call, where both linears hold one plain
    ``CpuInt4Kernel`` each (one part, no permutation, the same activations, no bias, one rank); else None."""
    layers = (gate_up, down)
    kernels = [getattr(layer, "quant_kernel", None) for layer in layers]
    if not all(type(k) is CpuInt4Kernel and k.perm is None and k.num_parts == 1 for k in kernels):
        return None
    if any(layer.bias is not None or layer.tp_size != 1 for layer in layers):
        return None
    if kernels[0].activations != kernels[1].activations:
        return None
    (gu_codes, gu_scales, gu_zeros), (dn_codes, dn_scales, dn_zeros) = (
        [k._buffers[name] for name in k.part_names[0]] for k in kernels)
    gu_group, dn_group = kernels[0].group_size, kernels[1].group_size
    op, a8_rows = torch.ops.folovllm.int4_mlp.default, kernels[0].a8_rows
    return bound_op_call(op, gu_codes, gu_scales, gu_zeros, gu_group, dn_codes, dn_scales, dn_zeros, dn_group,
                         a8_rows)
