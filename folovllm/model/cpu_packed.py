"""Prepacked linear weights on CPU: the weight is reordered once into oneDNN's blocked layout.

A plain ``F.linear`` on CPU re-lays out (or reads strided) its weight on every call; holding it in
the blocked layout the GEMM kernel wants makes small-batch matmuls (decode) about twice as fast. For
bfloat16 the results are bit-identical to ``F.linear`` (the same oneDNN kernel family accumulates
in fp32 either way); for float32 they differ in the last bits (oneDNN instead of MKL's sgemm).

With ``bf16_kernel`` (the engine's ``cpu_bf16_linear``) a bf16 weight is instead packed for FoloVLLM's
own kernel (csrc/cpu_bf16_linear.cpp: ``torch.ops.folovllm_cpu_linear``), which streams the weight
faster than oneDNN at decode (a batch-1 step is mostly reading weights) and keeps up with it at larger
batches (docs/benchmarks.md). It takes weights
of a multiple of 64 rows and an even number of columns; others stay with oneDNN. It too accumulates in
fp32, in its own order: results equal ``F.linear``'s or differ by one bf16 rounding step.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from folovllm.model.linear_method import LinearMethod, UnquantizedLinearMethod, get_linear_method
from folovllm.model.op_call import bound_op_call

UNQUANTIZED = "unquantized"
BF16_KERNEL_ROWS = 64  # the bf16 kernel packs weights in blocks of this many output rows


def cpu_prepack_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether weights of ``dtype`` on ``device`` can be held prepacked (oneDNN on CPU, bf16 or fp32)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def bf16_kernel_fits(weight: torch.Tensor) -> bool:
    """Whether the bf16 kernel takes this [out, in] weight (its library must be loaded to run it)."""
    out_features, in_features = weight.shape
    return weight.dtype == torch.bfloat16 and out_features % BF16_KERNEL_ROWS == 0 and in_features % 2 == 0


def pack_linear_weight(weight: torch.Tensor, bf16_kernel: bool = False) -> torch.Tensor:
    """A plain [out, in] weight in oneDNN's blocked layout (an opaque mkldnn tensor of the same shape),
    or with ``bf16_kernel``, where it fits, in the bf16 kernel's layout [out/64, in/2, 64, 2]."""
    if bf16_kernel and bf16_kernel_fits(weight):
        return torch.ops.folovllm_cpu_linear.pack(weight.detach())
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ packed^T (+ bias): one call of the kernel the weight was packed for."""
    if packed.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return torch.ops.folovllm_cpu_linear.linear(x, packed, bias)


class PackedLinearMethod(UnquantizedLinearMethod):
    """An unquantized weight that loads plain (so merged shards fill their slots) and is then packed.

    After ``process_weights_after_loading`` the layer's ``weight`` parameter holds the packed tensor
    (same element count, so weight bytes stay honest); nothing reads it as a plain tensor.
    ``bf16_kernel``: pack bf16 weights for FoloVLLM's kernel where they fit, else for oneDNN.
    """

    def __init__(self, bf16_kernel: bool = False) -> None:
        self.bf16_kernel = bf16_kernel

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.weight = nn.Parameter(pack_linear_weight(layer.weight, self.bf16_kernel), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return packed_linear(x, layer.weight, bias)

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        packed = layer.weight
        if packed.is_mkldnn:
            onednn = torch.ops.mkldnn._linear_pointwise.default
            return lambda x: onednn(x, packed, bias, "none", [], "")
        kernel = torch.ops.folovllm_cpu_linear.linear.default
        return bound_op_call(kernel, packed, bias)


def select_linear_method(quantization: str, quant_config: dict | None, dtype: torch.dtype,
                         device: torch.device, cpu_prepack: bool, bf16_kernel: bool = False) -> LinearMethod:
    """The method every linear layer of a model uses: the checkpoint's format, packed on CPU if asked
    (``bf16_kernel``: for FoloVLLM's bf16 kernel where a weight fits it; its library must be loaded).

    Quantized formats keep their own method; only unquantized weights are prepacked.
    """
    if quantization == UNQUANTIZED and cpu_prepack and cpu_prepack_supported(dtype, device):
        return PackedLinearMethod(bf16_kernel)
    return get_linear_method(quantization, quant_config)
