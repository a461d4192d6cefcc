"""Quantized matmuls: each is a module holding its repacked weight as buffers, ``forward(x) -> x W^T``.

``gptq_kernel`` picks one for a layer, once, after loading:

- 4-bit: our CPU int4 kernel (``cpu_int4.CpuInt4Kernel``) or torch's (``_weight_int4pack_mm_for_cpu``),
  as the platform's ``LinearKernels.quant`` says. Both compute w = (q - 8) * scale + zero per group.
  GPTQ's w = (q - z) * s is the same with zero = (8 - z) * s.
- 8-bit, one group over the input: an int8 kernel with per-output-channel scales (ours,
  ``cpu_int4.pack_int8``, or torch's ``_weight_int8pack_mm``) on q - 128; an asymmetric zero point adds
  sum(x) * (128 - z) * s.
- 8-bit with groups: two int4 matmuls, on the high and on the low nibble of each code
  (q = 16 hi + lo), with scales 16 s and s; the zero points go into their offsets.

Act-order (a ``g_idx`` that is not sorted): the weight rows are permuted once at load so that each
group's rows are contiguous, as the grouped kernels need; each call then permutes x's columns the same
way (one gather of x, much cheaper than anything done to the weight per call). Folding that
permutation into the previous layer's output instead would tie layers together, so it is not done.

Anything a kernel cannot take (``reference`` kernels, as on a GPU today; output size not a multiple of 16,
groups the int4 kernel cannot tile) runs the reference path: dequantize the whole weight, one fp32 matmul.
Ours tiles more: any multiple of 8 rows per group, the last group partial (576 rows in groups of 128).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from folovllm.model.quantization.cpu_int4 import (
    CpuInt4Kernel,
    cpu_int4_fits,
    cpu_int8_fits,
    pack_int8,
    packed_int8_rows,
)
from folovllm.model.quantization.op_call import bound_op_call
from folovllm.model.quantization.pack import unpack_int32
from folovllm.platforms.interface import LinearKernels

logger = logging.getLogger(__name__)

INT4_GROUP_SIZES = (256, 128, 64, 32)  # what torch's CPU int4 kernel accepts, largest (fewest scales) first
# what ours accepts (any multiple of 8), largest first: fewer groups, fewer scale-and-zero steps per output
CPU_INT4_GROUP_SIZES = (4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8)
INT4_N_MULTIPLE = 16  # the CPU int4 repack needs the output size to be a multiple of this
INT8_K_MULTIPLE = 16  # the CPU int8 kernel reads the input in blocks of this many


def dequantize_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                    bits: int, zero_offset: int) -> torch.Tensor:
    """GPTQ tensors -> the fp32 weight [in, out]: w[k, n] = (q[k, n] - z[g, n]) * s[g, n], g = g_idx[k]."""
    codes = unpack_int32(qweight, bits, 0).float()
    zeros = unpack_int32(qzeros, bits, 1).float() + zero_offset
    groups = g_idx.long()
    return (codes - zeros[groups]) * scales.float()[groups]


class ReferenceGPTQKernel(nn.Module):
    """Dequantize the whole weight every call, then one fp32 matmul: slow, and plainly right."""

    def __init__(self, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                 bits: int, zero_offset: int) -> None:
        super().__init__()
        self.bits, self.zero_offset = bits, zero_offset
        self.register_buffer("qweight", qweight)
        self.register_buffer("qzeros", qzeros)
        self.register_buffer("scales", scales)
        self.register_buffer("g_idx", g_idx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = dequantize_gptq(self.qweight, self.qzeros, self.scales, self.g_idx, self.bits, self.zero_offset)
        return (x.float() @ weight).to(x.dtype)


class Int8ChannelKernel(nn.Module):
    """w[n, k] = q[n, k] * scale[n] (+ offset[n]): int8 codes, one scale (and offset) per output channel.

    ``kernel`` (``LinearKernels.quant``): reference dequantizes; folovllm is ours (codes held in ``pack_int8``'s
    layout) where the shape fits, else torch's, as is torch."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                 kernel: str) -> None:
        super().__init__()
        self.ours = kernel == "folovllm" and cpu_int8_fits(codes.shape[1], codes.shape[0], scales.dtype)
        self.reference = kernel == "reference" or (not self.ours and codes.shape[1] % INT8_K_MULTIPLE != 0)
        self.register_buffer("codes", pack_int8(codes) if self.ours else codes)  # int8 [out, in] (or packed)
        self.register_buffer("scales", scales)  # [out], the activation dtype
        self.register_buffer("offsets", offsets)  # [out] or None: added to every weight of a channel

    def code_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The int8 codes of output channels ``rows``: [*rows.shape, in]."""
        return packed_int8_rows(self.codes, rows) if self.ours else self.codes[rows]

    def rows_of(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` of the weight, dequantized (q * scale): the embedding lookup of a tied int8 head. Our
        packed codes go through one op (``int8_rows``: the same values as the torch ops here, which are about
        ten small calls a step)."""
        if self.ours:
            return torch.ops.folovllm.int8_rows(self.codes, self.scales, ids, dtype)
        return (self.code_rows(ids).float() * self.scales[ids].float().unsqueeze(-1)).to(dtype)

    def direct(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward`` as one call of our int8 op where that is all it does."""
        if not self.ours or self.offsets is not None:
            return self.forward
        op, codes, scales = torch.ops.folovllm.int8_gemm.default, self.codes, self.scales
        return bound_op_call(op, codes, scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reference:
            weight = self.codes.float() * self.scales.float()[:, None]
            if self.offsets is not None:
                weight = weight + self.offsets.float()[:, None]
            return (x.float() @ weight.t()).to(x.dtype)
        if self.ours:
            y = torch.ops.folovllm.int8_gemm(x, self.codes, self.scales)
        else:
            y = torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales)
        if self.offsets is not None:
            y = y + (x.float().sum(-1, keepdim=True) * self.offsets.float()).to(y.dtype)
        return y


class Int4Kernel(nn.Module):
    """One or more CPU int4 matmuls summed (several: the nibbles of 8-bit codes), after an optional
    permutation of x's columns (act-order)."""

    def __init__(self, packed: list[torch.Tensor], scales_zeros: list[torch.Tensor], group_size: int,
                 perm: torch.Tensor | None) -> None:
        super().__init__()
        self.group_size, self.num_parts = group_size, len(packed)
        for i, (weight, sz) in enumerate(zip(packed, scales_zeros)):
            self.register_buffer(f"packed{i}", weight)  # uint8 [out, in / 2], torch's int4 layout
            self.register_buffer(f"scales_zeros{i}", sz)  # [in / group_size, out, 2], activation dtype
        self.register_buffer("perm", perm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        y = None
        for i in range(self.num_parts):
            part = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, getattr(self, f"packed{i}"), self.group_size, getattr(self, f"scales_zeros{i}"))
            y = part if y is None else y + part
        return y


def apply_quant_kernel(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A quantized layer's forward: its ``quant_kernel`` (set after loading) on x, then the bias if any."""
    y = layer.quant_kernel(x)
    return y if bias is None else y + bias


def bind_quant_kernel(layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``apply_quant_kernel`` for this layer as one callable: the kernel's op called directly where it
    offers one (``direct``), else its forward."""
    kernel = layer.quant_kernel
    run = kernel.direct() if hasattr(kernel, "direct") else kernel.forward
    return run if bias is None else lambda x: run(x) + bias


def _int4_tiling(g_idx: torch.Tensor, backend: str) -> tuple[torch.Tensor | None, int, torch.Tensor] | None:
    """(row permutation or None, int4 group size, GPTQ group of each int4 group), or None if no size fits.

    After sorting rows by group, an int4 group must never straddle two GPTQ groups. Torch's groups must
    also divide the input size (a partial last GPTQ group, e.g. 576 rows in groups of 128, then tiles by
    64); ours may end with a partial group.
    """
    perm = None
    if bool((g_idx[1:] < g_idx[:-1]).any()):
        perm = torch.argsort(g_idx, stable=True)
        g_idx = g_idx[perm]
    size = g_idx.numel()
    for tile in (INT4_GROUP_SIZES if backend == "torch" else CPU_INT4_GROUP_SIZES):
        if size % tile and (backend == "torch" or size % 8):
            continue
        firsts = g_idx[::tile]
        if bool((firsts.repeat_interleave(tile)[:size] == g_idx).all()):
            return perm, tile, firsts.long()
    return None


def _int4_part(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [in, out] in [0, 16), per-tile scales/offsets [tiles, out] -> (packed, scales_zeros)."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.t().contiguous().to(torch.int32), 1)
    return packed, torch.stack([scales, offsets], dim=-1).to(dtype).contiguous()


def int4_group_kernel(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                      dtype: torch.dtype, kernels: LinearKernels) -> nn.Module:
    """codes [out, in] in [0, 16), scale and zero [out, in / group_size] -> the int4 kernel (``kernels.quant``:
    ours where it fits, else torch's) computing w = (q - 8) * scale + zero (scale and zero rounded to ``dtype``)."""
    if kernels.quant == "folovllm" and cpu_int4_fits(codes.shape[1], codes.shape[0], group_size, dtype):
        return CpuInt4Kernel([codes], [scales], [zeros], group_size, dtype, None, kernels.int4_activations)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    scales_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(dtype).contiguous()
    return Int4Kernel([packed], [scales_zeros], group_size, None)


def _int4_kernel(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                 bits: int, dtype: torch.dtype, kernels: LinearKernels) -> nn.Module | None:
    if codes.shape[1] % INT4_N_MULTIPLE:
        return None
    backend = kernels.quant
    if backend == "folovllm" and dtype not in (torch.bfloat16, torch.float32):
        backend = "torch"  # ours takes bf16 and fp32 activations
    tiling = _int4_tiling(g_idx, backend)
    if tiling is None:
        return None
    perm, tile, groups = tiling
    if perm is not None:
        codes = codes[perm]
    # scales rounded to the activation dtype first, so the offsets are computed from the scales used
    s, z = scales[groups].to(dtype).float(), zeros[groups].float()
    if bits == 4:
        parts = [(codes, s, (8 - z) * s)]
    else:  # (q - z) s = (hi - 8) 16s + (8 - z_hi) 16s + (lo - 8) s + (8 - z_lo) s, with z = 16 z_hi + z_lo
        z_hi, z_lo = torch.div(z, 16, rounding_mode="floor"), torch.remainder(z, 16)
        parts = [(codes >> 4, 16 * s, (8 - z_hi) * 16 * s), (codes & 15, s, (8 - z_lo) * s)]
    if backend == "folovllm" and cpu_int4_fits(codes.shape[0], codes.shape[1], tile, dtype):
        return CpuInt4Kernel([q.t() for q, _, _ in parts], [sc.t() for _, sc, _ in parts],
                             [off.t() for _, _, off in parts], tile, dtype, perm, kernels.int4_activations)
    packed, scales_zeros = zip(*(_int4_part(q, sc, off, dtype) for q, sc, off in parts))
    return Int4Kernel(list(packed), list(scales_zeros), tile, perm)


def gptq_kernel(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                bits: int, zero_offset: int, dtype: torch.dtype, kernels: LinearKernels) -> nn.Module:
    """The fastest kernel that takes this GPTQ layer (``kernels.quant``: folovllm, torch, or reference:
    dequantize-then-matmul)."""
    module: nn.Module | None = None
    kernel = kernels.quant
    if kernel != "reference":
        codes = unpack_int32(qweight, bits, 0)  # [in, out]
        zeros = unpack_int32(qzeros, bits, 1) + zero_offset  # [groups, out]
        single_group = bool((g_idx == g_idx[0]).all())
        if bits == 8 and single_group and codes.shape[0] % INT8_K_MULTIPLE == 0:
            group = int(g_idx[0])
            scale = scales[group].to(dtype)
            offsets = (128 - zeros[group].float()) * scale.float()  # zero for symmetric checkpoints
            module = Int8ChannelKernel((codes - 128).to(torch.int8).t().contiguous(), scale,
                                       offsets.to(dtype) if bool(offsets.any()) else None, kernel)
        else:
            module = _int4_kernel(codes, zeros, scales.float(), g_idx, bits, dtype, kernels)
        if module is None:
            logger.warning("no CPU kernel takes a %d-bit [%d x %d] GPTQ weight with these groups; "
                           "using the (slow) reference path", bits, qweight.shape[1], codes.shape[0])
    return module or ReferenceGPTQKernel(qweight, qzeros, scales, g_idx, bits, zero_offset)
