"""Prepacked linear weights on CPU: the weight is reordered once into oneDNN's blocked layout.

A plain ``F.linear`` on CPU re-lays out (or reads strided) its weight on every call; holding it in
the blocked layout the GEMM kernel wants makes small-batch matmuls (decode) about twice as fast. For
bfloat16 the results are bit-identical to ``F.linear`` (the same oneDNN kernel family accumulates
in fp32 either way); for float32 they differ in the last bits (oneDNN instead of MKL's sgemm).
"""
from __future__ import annotations

import torch
from torch import nn

from folovllm.model.linear_method import LinearMethod, UnquantizedLinearMethod, get_linear_method

UNQUANTIZED = "unquantized"


def cpu_prepack_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether weights of ``dtype`` on ``device`` can be held prepacked (oneDNN on CPU, bf16 or fp32)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A plain [out, in] weight in oneDNN's blocked layout (an opaque mkldnn tensor of the same shape)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ packed^T (+ bias): one oneDNN call."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinearMethod(UnquantizedLinearMethod):
    """An unquantized weight that loads plain (so merged shards fill their slots) and is then packed.

    After ``process_weights_after_loading`` the layer's ``weight`` parameter holds the packed tensor
    (same shape and element count, so weight bytes stay honest); nothing reads it as a plain tensor.
    """

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.weight = nn.Parameter(pack_linear_weight(layer.weight), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return packed_linear(x, layer.weight, bias)


def select_linear_method(quantization: str, quant_config: dict | None, dtype: torch.dtype,
                         device: torch.device, cpu_prepack: bool) -> LinearMethod:
    """The method every linear layer of a model uses: the checkpoint's format, packed on CPU if asked.

    Quantized formats keep their own method; only unquantized weights are prepacked.
    """
    if quantization == UNQUANTIZED and cpu_prepack and cpu_prepack_supported(dtype, device):
        return PackedLinearMethod()
    return get_linear_method(quantization, quant_config)
