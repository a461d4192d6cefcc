"""A quantized LM head: an int8 copy (one scale per vocabulary row) of the output projection.

At batch 1 the logits matmul reads the whole [vocab, hidden] head every step; for a small model with
4-bit linears it is the largest single read of a decode step. Held as int8 codes q with a per-row
scale s (w = q s, symmetric), it is read at half the bytes by an int8 CPU kernel (ours or torch's). A head
tied to the embedding keeps only the int8 copy: the embedding lookup dequantizes its rows from it.

``quantize_lm_head`` (auto | on | off): the platform decides (``LinearKernels.int8_lm_head``); auto turns it
on when the model's linears are quantized on the CPU (a GPTQ checkpoint, ``--quantization int8``, or GGUF
weights kept packed).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from folovllm.model.quantization.int8 import quantize_int8_per_channel
from folovllm.model.quantization.kernels import Int8ChannelKernel, apply_quant_kernel, bind_quant_kernel
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod


def int8_head_kernel(weight: torch.Tensor, dtype: torch.dtype, kernel: str) -> Int8ChannelKernel:
    """The int8 logits matmul for a [vocab, hidden] head (``kernel``: folovllm, torch or reference)."""
    codes, scales = quantize_int8_per_channel(weight, dtype)
    return Int8ChannelKernel(codes, scales, None, kernel)


class Int8HeadMethod(UnquantizedLinearMethod):
    """An LM head: loads plain (by vocabulary rows), then held as ``int8_head_kernel``."""

    def __init__(self, kernel: str = "reference") -> None:
        self.kernel = kernel

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        kernel = int8_head_kernel(layer.weight.data, layer.weight.dtype, self.kernel)
        del layer.weight  # the codes replace it
        layer.quant_kernel = kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return apply_quant_kernel(layer, x, bias)

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        return bind_quant_kernel(layer, bias)

    def row_table(self, layer: nn.Module) -> nn.Module | None:
        """The int8 codes: a tied lookup dequantizes its rows from them."""
        return layer.quant_kernel

    def argmax(self, layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """``int8_argmax`` on a head held for our int8 kernel: the matmul and each row's argmax in one call
        (for bf16 rows the best logit is kept inside the matmul's loop, the logits never written); None for
        torch's kernel or the reference path."""
        kernel: Int8ChannelKernel = layer.quant_kernel
        if not kernel.ours or kernel.offsets is not None:
            return None
        op, codes, scales = torch.ops.folovllm.int8_argmax.default, kernel.codes, kernel.scales
        return lambda x: op(x, codes, scales, True)
