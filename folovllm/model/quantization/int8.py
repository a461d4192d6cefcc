"""INT8 weight-only quantization at load time (W8A16): any float checkpoint, per-output-channel scales.

The layer loads its weight as the unquantized method would; ``process_weights_after_loading`` then
replaces it by int8 codes q = round(w / s), s = max|w[n, :]| / 127 (symmetric, codes in [-127, 127]),
multiplied by an int8 CPU kernel (ours or torch's) with activations in the model's dtype.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from folovllm.model.quantization.kernels import Int8ChannelKernel, apply_quant_kernel, bind_quant_kernel
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod, register_linear_method
from folovllm.platforms.interface import LinearKernels

INT8_MAX = 127


def quantize_int8_per_channel(weight: torch.Tensor,
                              scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (int8 codes [out, in], scales [out] in ``scale_dtype``); an all-zero row gets
    scale 1. The scales are rounded to ``scale_dtype`` before the codes are computed, so the codes round
    against the scale the kernel multiplies by."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / INT8_MAX).to(scale_dtype)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(w / scales.float()[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scales


@register_linear_method("int8")
class Int8LinearMethod(UnquantizedLinearMethod):
    """Loads a plain weight, quantizes it to int8 once, then runs ``Int8ChannelKernel``."""

    def __init__(self, kernel: str = "reference") -> None:
        self.kernel = kernel  # folovllm, torch or reference (LinearKernels.quant)

    @classmethod
    def from_config(cls, quant_config: dict[str, Any], kernels: LinearKernels) -> Int8LinearMethod:
        return cls(kernels.quant)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        codes, scales = quantize_int8_per_channel(layer.weight.data)
        dtype = layer.weight.dtype
        del layer.weight  # the codes replace it
        layer.quant_kernel = Int8ChannelKernel(codes, scales.to(dtype), None, self.kernel)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return apply_quant_kernel(layer, x, bias)

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        return bind_quant_kernel(layer, bias)
