"""GPTQ checkpoints (4- and 8-bit, grouped or not, act-order or not): load the packed tensors, repack once.

Checkpoint tensors per linear layer, in HF's ``[in, out]`` orientation (``bits``-wide codes, 32 // bits
per int32, the first in the lowest bits; see ``pack.py``):

- ``qweight`` int32 [in / pack, out]: codes packed along the input.
- ``qzeros`` int32 [groups, out / pack]: zero points packed along the output (v1 format: minus one).
- ``scales`` float16 (any float) [groups, out].
- ``g_idx`` int32 [in]: each input row's group. Required with ``desc_act``; otherwise optional
  (then row k is in group k // group_size).
- ``bias`` [out], optional, where the layer has one.

groups = ceil(in / group_size), or 1 with group_size -1; w[k, n] = (q[k, n] - z[g, n]) * s[g, n].
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from folovllm.model.layers.linear import RowParallelLinear
from folovllm.model.quantization.gptq_config import GPTQConfig
from folovllm.model.quantization.kernels import apply_quant_kernel, bind_quant_kernel, gptq_kernel
from folovllm.model.quantization.linear_method import LinearMethod, register_linear_method, set_weight_attrs
from folovllm.platforms.interface import LinearKernels

_CHECKPOINT_TENSORS = ("qweight", "qzeros", "scales", "g_idx")


def _param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, fill: float = 0) -> nn.Parameter:
    return nn.Parameter(torch.full(shape, fill, dtype=dtype, device=device), requires_grad=False)


@register_linear_method("gptq")
class GPTQLinearMethod(LinearMethod):
    """Holds a layer's GPTQ tensors while loading, then the fastest kernel for them (``kernels.py``)."""

    def __init__(self, config: GPTQConfig, kernels: LinearKernels | None = None) -> None:
        self.config, self.kernels = config, kernels or LinearKernels()

    @classmethod
    def from_config(cls, quant_config: dict[str, Any], kernels: LinearKernels) -> GPTQLinearMethod:
        return cls(GPTQConfig.from_dict(quant_config), kernels)

    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_size: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        cfg, pack = self.config, self.config.pack_factor
        if input_size % pack or output_size % pack:
            raise ValueError(f"a {cfg.bits}-bit GPTQ linear needs sizes divisible by {pack}; "
                             f"this one is [{output_size} x {input_size}] (out x in)")
        # A group split across tensor-parallel ranks has no single owner, so each rank then holds
        # every group: act-order scatters a rank's rows over all groups; group_size -1 has one group.
        splits_groups = cfg.group_size != -1 and not (cfg.desc_act and isinstance(layer, RowParallelLinear))
        full_input = input_size if splits_groups else input_size * layer.tp_size
        if splits_groups and layer.tp_size > 1 and input_size % cfg.group_size:
            raise ValueError(f"input size {input_size} per rank is not a multiple of group_size {cfg.group_size}")
        groups = 1 if cfg.group_size == -1 else math.ceil(full_input / cfg.group_size)
        group_dim = 0 if splits_groups else None

        qweight = _param((input_size // pack, output_size), torch.int32, device)
        set_weight_attrs(qweight, input_dim=0, output_dim=1, packed_dim=0, pack_factor=pack)
        qzeros = _param((groups, output_size // pack), torch.int32, device)
        set_weight_attrs(qzeros, input_dim=group_dim, output_dim=1, packed_dim=1, pack_factor=pack)
        scales = _param((groups, output_size), torch.float32, device)  # fp16 in checkpoints: kept exact
        set_weight_attrs(scales, input_dim=group_dim, output_dim=1)
        g_idx = _param((input_size,), torch.int32, device, fill=-1)  # -1: not loaded (see _load_shared)
        set_weight_attrs(g_idx, input_dim=0, output_dim=None, same_for_every_shard=True,
                         optional_in_checkpoint=not cfg.desc_act)
        for name, param in zip(_CHECKPOINT_TENSORS, (qweight, qzeros, scales, g_idx)):
            layer.register_parameter(name, param)
        if bias:
            bias_param = _param((output_size,), dtype, device)
            set_weight_attrs(bias_param, output_dim=0, input_dim=None)
            layer.register_parameter("bias", bias_param)
        else:
            layer.register_parameter("bias", None)
        layer.activation_dtype = dtype
        # a row-parallel rank's g_idx counts groups from the first input; its scales start at its first group
        row_split = splits_groups and isinstance(layer, RowParallelLinear)
        layer.first_group = layer.tp_rank * groups if row_split else 0

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        cfg = self.config
        groups = layer.scales.shape[0]
        g_idx = layer.g_idx.data
        if bool((g_idx == -1).all()):
            if cfg.desc_act:
                raise ValueError("a GPTQ checkpoint with desc_act (act-order) needs a g_idx tensor per layer")
            size = g_idx.numel()
            g_idx = (torch.arange(size, dtype=torch.int32, device=g_idx.device) // cfg.group_size
                     if cfg.group_size != -1 else torch.zeros(size, dtype=torch.int32, device=g_idx.device))
        else:
            g_idx = g_idx - layer.first_group
        if int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
            raise ValueError(f"g_idx values must lie in [0, {groups}) (the layer's groups); "
                             f"got [{int(g_idx.min())}, {int(g_idx.max())}]")
        kernel = gptq_kernel(layer.qweight.data, layer.qzeros.data, layer.scales.data, g_idx, cfg.bits,
                             cfg.zero_offset, layer.activation_dtype, self.kernels)
        for name in _CHECKPOINT_TENSORS:
            delattr(layer, name)  # the kernel holds what it needs (a reference kernel holds these)
        layer.quant_kernel = kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return apply_quant_kernel(layer, x, bias)

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        return bind_quant_kernel(layer, bias)
