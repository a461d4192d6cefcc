"""A quantized LM head: an int8 copy (one scale per vocabulary row) of the output projection.

At batch 1 the logits matmul reads the whole [vocab, hidden] head every step; for a small model with
4-bit linears it is the largest single read of a decode step. Held as int8 codes q with a per-row
scale s (w = q s, symmetric), it is read at half the bytes by an int8 CPU kernel (ours or torch's). A head tied to
the embedding keeps only the int8 copy: the embedding lookup dequantizes its rows from it.

``quantize_lm_head`` (auto | on | off): auto turns it on when the model's linears are quantized on
the CPU (a GPTQ checkpoint, ``--quantization int8``, or GGUF weights kept packed).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from folovllm.model.linear_method import UnquantizedLinearMethod
from folovllm.model.quant.gptq_config import kernel_choice
from folovllm.model.quant.int8 import quantize_int8_per_channel
from folovllm.model.quant.kernels import Int8ChannelKernel, apply_quant_kernel, bind_quant_kernel

QUANTIZE_LM_HEAD = ("auto", "on", "off")


def resolve_quantize_lm_head(choice: str, quantized_linears: bool, device: torch.device) -> bool:
    """Whether the LM head is held int8: ``on``/``off`` as asked; ``auto``: with quantized linears on the CPU."""
    if choice not in QUANTIZE_LM_HEAD:
        raise ValueError(f"quantize_lm_head must be one of {', '.join(QUANTIZE_LM_HEAD)}; got {choice!r}")
    if choice == "auto":
        return quantized_linears and device.type == "cpu"
    return choice == "on"


def int8_head_kernel(weight: torch.Tensor, dtype: torch.dtype) -> Int8ChannelKernel:
    """The int8 logits matmul for a [vocab, hidden] head (``FOLOVLLM_QUANT_KERNEL=reference``: dequantize)."""
    codes, scales = quantize_int8_per_channel(weight, dtype)
    return Int8ChannelKernel(codes, scales, None, kernel_choice())


def int8_rows(kernel: Int8ChannelKernel, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of the head's int8 copy, dequantized: the embedding lookup of a tied head. Our packed
    codes on the CPU go through one op (``int8_rows``: the same values as the torch ops here, which are
    about ten small calls a step)."""
    ops = torch.ops.folovllm_cpu_quant
    if kernel.ours and ids.device.type == "cpu" and hasattr(ops, "int8_rows"):  # (a library built before it)
        return ops.int8_rows(kernel.codes, kernel.scales, ids, dtype)
    return (kernel.code_rows(ids).float() * kernel.scales[ids].float().unsqueeze(-1)).to(dtype)


class Int8HeadMethod(UnquantizedLinearMethod):
    """An untied LM head: loads plain (by vocabulary rows), then held as ``int8_head_kernel``."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        kernel = int8_head_kernel(layer.weight.data, layer.weight.dtype)
        del layer.weight  # the codes replace it
        layer.quant_kernel = kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return apply_quant_kernel(layer, x, bias)

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        return bind_quant_kernel(layer, bias)
