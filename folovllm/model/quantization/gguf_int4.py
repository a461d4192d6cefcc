"""GGUF 4-bit block types kept packed: Q4_0, Q4_1 and Q4_K repacked once for a CPU int4 kernel.

Each of these types stores 4-bit codes q in [0, 16) with a scale and an offset per 32 weights of a
row, so each maps exactly (up to rounding the scale and offset to the activation dtype) onto the
kernel's form w = (q - 8) * scale + zero with groups of 32:

- Q4_0 (block of 32: fp16 d, 16 bytes of codes): w = d (q - 8); scale = d, zero = 0.
- Q4_1 (fp16 d, fp16 m, codes): w = d q + m; scale = d, zero = m + 8 d.
- Q4_K (super-block of 256: fp16 d and dmin, 8 six-bit sub-block scales sc and mins m, codes):
  w = d sc q - dmin m; scale = d sc, zero = 8 d sc - dmin m, per 32-weight sub-block.

The block layouts (sizes, the nibble order, Q4_K's six-bit scale packing) are read with the ``gguf``
package's constants and helpers; only the step to (codes, scale, zero) is written here.
"""
from __future__ import annotations

from collections.abc import Callable

import gguf
import numpy as np
import torch
from torch import nn

from folovllm.model.quantization.kernels import (
    INT4_N_MULTIPLE,
    apply_quant_kernel,
    bind_quant_kernel,
    int4_group_kernel,
)
from folovllm.model.quantization.linear_method import LinearMethod, register_bias, set_weight_attrs
from folovllm.platforms.interface import LinearKernels

Q = gguf.GGMLQuantizationType
GGUF_INT4_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q4_K)
GROUP = 32  # weights per scale and zero in every type above (Q4_K: per sub-block)
# the parameters a packed GGUF linear loads: codes, then per-group scale and zero (the kernel's form)
GGUF_INT4_TENSORS = ("qcodes", "qscales", "qzeros")


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """[blocks, n] packed bytes -> [blocks, 2n] codes: each ``run`` bytes give ``run`` low nibbles, then
    ``run`` high nibbles (ggml's order: 16 per Q4_0/Q4_1 block, 32 per 64-weight chunk of Q4_K)."""
    blocks = qs.reshape(qs.shape[0], -1, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (blocks & np.uint8(0x0F)).reshape(qs.shape[0], -1)


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.view(np.float16).astype(np.float32)


def gguf_int4_parts(data: np.ndarray, qtype: gguf.GGMLQuantizationType,
                    rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF tensor's raw blocks ([rows, bytes per row] uint8) -> (codes uint8 [rows, cols] in [0, 16),
    scale float32 [rows, cols / 32], zero float32 [rows, cols / 32]) with w = (q - 8) scale + zero."""
    if qtype not in GGUF_INT4_TYPES:
        raise ValueError(f"GGUF type {qtype.name} has no 4-bit repack; packable: {[t.name for t in GGUF_INT4_TYPES]}")
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if cols % block_size:
        raise ValueError(f"a {qtype.name} row of {cols} weights is not a whole number of {block_size}-weight blocks")
    blocks = np.ascontiguousarray(data).reshape(-1, type_size)
    if blocks.shape[0] != rows * cols // block_size:
        raise ValueError(f"{qtype.name} data holds {blocks.shape[0]} blocks; [{rows} x {cols}] needs "
                         f"{rows * cols // block_size}")
    if qtype == Q.Q4_K:
        d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
        sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:4 + gguf.quants.Q4_K.K_SCALE_SIZE])
        scale = d * sc.astype(np.float32)  # [blocks, 8]: exact in float32 (11 x 6 bits)
        zero = 8 * scale - dmin * m.astype(np.float32)
        codes = _nibbles(blocks[:, 4 + gguf.quants.Q4_K.K_SCALE_SIZE:], 32)
    else:
        d = _f16(blocks[:, 0:2])
        offset = 4 if qtype == Q.Q4_1 else 2
        scale = d
        zero = _f16(blocks[:, 2:4]) + 8 * d if qtype == Q.Q4_1 else np.zeros_like(d)
        codes = _nibbles(blocks[:, offset:], 16)
    groups = cols // GROUP
    return (torch.from_numpy(codes.reshape(rows, cols)),
            torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, groups))),
            torch.from_numpy(np.ascontiguousarray(zero.reshape(rows, groups))))


def dequantize_int4_parts(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """(codes, scale, zero) -> the float32 weight [rows, cols]: (q - 8) scale + zero per 32 columns."""
    return (codes.float() - 8) * scales.repeat_interleave(GROUP, 1) + zeros.repeat_interleave(GROUP, 1)


def gguf_int4_fits(input_size: int, output_size: int) -> bool:
    """Whether the int4 kernels take a [output_size x input_size] layer in groups of 32."""
    return input_size % GROUP == 0 and output_size % INT4_N_MULTIPLE == 0


class GGUFInt4LinearMethod(LinearMethod):
    """A layer whose every checkpoint piece is a GGUF 4-bit type: loads (codes, scale, zero), then one
    int4 kernel call per forward (``kernels.quant``: ours or torch's; groups of 32)."""

    def __init__(self, kernels: LinearKernels) -> None:
        self.kernels = kernels

    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_size: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if not gguf_int4_fits(input_size, output_size):
            raise ValueError(f"the int4 kernels cannot hold a [{output_size} x {input_size}] (out x in) linear: "
                             f"they need inputs a multiple of {GROUP} and outputs a multiple of {INT4_N_MULTIPLE}; "
                             "load this model with load_quantized off")
        groups = input_size // GROUP
        shapes = {"qcodes": ((output_size, input_size), torch.uint8),
                  "qscales": ((output_size, groups), torch.float32),
                  "qzeros": ((output_size, groups), torch.float32)}
        for name, (shape, tensor_dtype) in shapes.items():
            param = nn.Parameter(torch.empty(shape, dtype=tensor_dtype, device=device), requires_grad=False)
            set_weight_attrs(param, output_dim=0, input_dim=1)
            layer.register_parameter(name, param)
        register_bias(layer, bias, output_size, dtype, device)
        layer.activation_dtype = dtype

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        kernel = int4_group_kernel(layer.qcodes.data, layer.qscales.data, layer.qzeros.data, GROUP,
                                   layer.activation_dtype, self.kernels)
        for name in GGUF_INT4_TENSORS:
            delattr(layer, name)  # the kernel holds the packed codes and its scales
        layer.quant_kernel = kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return apply_quant_kernel(layer, x, bias)

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        return bind_quant_kernel(layer, bias)
