"""GPTQ checkpoint tensors (the "v1" layout GPTQ tools write and vLLM/transformers read).

Per quantized linear ``<name>``: ``qweight`` int32 [in / (32 / bits), out] (codes packed along the
input dimension), ``qzeros`` int32 [groups, out / (32 / bits)] (zero point - 1, packed along the
output dimension), ``scales`` float16 [groups, out], ``g_idx`` int32 [in]. The weight reads back as
W[o, i] = (q[i, o] - (qzeros[g_idx[i], o] + 1)) * scales[g_idx[i], o].
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from folovllm.model.quantization.pack import pack_int32, unpack_int32
from folovllm.quantize.grid import QuantizedWeight

GPTQ_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


def gptq_tensors(name: str, weight: QuantizedWeight, bits: int) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of one quantized linear, named ``<name>.qweight`` etc."""
    return {
        f"{name}.qweight": pack_int32(weight.codes.T, bits, dim=0),
        f"{name}.qzeros": pack_int32(weight.zeros - 1, bits, dim=1),
        f"{name}.scales": weight.scales.to(torch.float16).contiguous(),
        f"{name}.g_idx": weight.g_idx.to(torch.int32).clone(),  # q/k/v share one: each piece owns its copy
    }


def dequantize_gptq(tensors: Mapping[str, torch.Tensor], name: str, bits: int) -> torch.Tensor:
    """The float32 [out, in] weight that ``<name>.qweight/qzeros/scales/g_idx`` stand for."""
    codes = unpack_int32(tensors[f"{name}.qweight"], bits, dim=0)  # [in, out]
    zeros = unpack_int32(tensors[f"{name}.qzeros"], bits, dim=1) + 1  # [groups, out]
    g_idx = tensors[f"{name}.g_idx"].long()
    scales = tensors[f"{name}.scales"].float()
    return ((codes - zeros[g_idx]).float() * scales[g_idx]).T.contiguous()


def dequantize_state_dict(tensors: Mapping[str, torch.Tensor], bits: int) -> dict[str, torch.Tensor]:
    """A GPTQ checkpoint's tensors as a plain float32 state dict (``<name>.weight`` for each linear)."""
    linears = {key.removesuffix(".qweight") for key in tensors if key.endswith(".qweight")}
    plain = {key: value.float() for key, value in tensors.items()
             if key.rpartition(".")[0] not in linears or key.endswith(".bias")}
    return {**plain, **{f"{name}.weight": dequantize_gptq(tensors, name, bits) for name in sorted(linears)}}
