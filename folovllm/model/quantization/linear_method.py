"""How a linear layer holds and applies its weight: one ``LinearMethod`` per weight format, by name.

The linear layers (``model/layers/linear.py``) own the shapes and which slice of a checkpoint tensor they
keep; the method owns the tensors that hold the weight (plain, packed, quantized + scales) and the matmul,
with the kernels the platform picked (``LinearKernels``). A new format is a new registered class; the model
files do not change.
"""
from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from folovllm.model.quantization.op_call import bound_op_call
from folovllm.platforms.interface import LinearKernels
from folovllm.registry import Registry

LINEAR_METHODS: Registry[type[LinearMethod]] = Registry("linear method")
register_linear_method = LINEAR_METHODS.register  # class decorator: selectable as a checkpoint's quantization


def _import_builtin_quant_methods() -> None:
    # Each quantized format registers itself when its module is imported (they import this module).
    import folovllm.model.quantization.gptq  # noqa: F401
    import folovllm.model.quantization.int8  # noqa: F401


def get_linear_method(name: str, quant_config: dict[str, Any] | None = None,
                      kernels: LinearKernels | None = None) -> LinearMethod:
    """A fresh method for a quantization name, built from the checkpoint's ``quantization_config`` and the
    platform's kernels (default: plain torch, the reference). ValueError listing the supported names for an
    unknown one.
    """
    _import_builtin_quant_methods()
    if name not in LINEAR_METHODS.names():
        raise ValueError(f"checkpoint quantization {name!r} is not supported; "
                         f"supported: {sorted(LINEAR_METHODS.names())}")
    return LINEAR_METHODS.get(name).from_config(quant_config or {}, kernels or LinearKernels())


def set_weight_attrs(param: nn.Parameter, **attrs: Any) -> None:
    """Tag a parameter for its layer's weight_loader (``output_dim``, ``input_dim``, ...)."""
    for key, value in attrs.items():
        setattr(param, key, value)


def register_bias(layer: nn.Module, bias: bool, output_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """The layer's ``bias`` parameter [output_size], sharded with its outputs (None without a bias)."""
    if not bias:
        layer.register_parameter("bias", None)
        return
    param = nn.Parameter(torch.empty(output_size, dtype=dtype, device=device), requires_grad=False)
    set_weight_attrs(param, output_dim=0, input_dim=None)
    layer.register_parameter("bias", param)


class LinearMethod(ABC):
    """Creates a linear layer's weight tensors, finishes them after loading, and applies them.

    ``create_weights`` registers parameters on the layer and tags each with ``output_dim`` /
    ``input_dim``: the dimension that a shard (merged q/k/v, gate/up) or a tensor-parallel rank
    slices along, or None when that parameter is not split that way. The layer's weight_loader
    uses those tags, so it works for any method's parameters.
    """

    # False: the method adds to its kernel's result (LoRA), so a compiled form that calls the layer's
    # kernel itself (the fused int4 MLP) must not stand in for it
    fusable = True

    @classmethod
    def from_config(cls, quant_config: dict[str, Any], kernels: LinearKernels) -> LinearMethod:
        """The method for a checkpoint's ``quantization_config`` and the platform's kernels (methods without
        settings ignore them)."""
        return cls()

    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_size: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """Register the parameters of a [output_size x input_size] linear (this rank's part) on layer."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack or quantize once every checkpoint tensor is in (nothing to do by default)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, input_size] -> [T, output_size], adding ``bias`` when given."""

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x -> apply(layer, x, bias)`` as one callable; a method may hold its tensors and call its
        kernel directly (same result), skipping the lookups ``apply`` makes per call."""
        return functools.partial(self.apply, layer, bias=bias)

    def argmax(self, layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """x [N, in] -> each row's index of its largest output [N] (int64, the first of equal ones), without
        writing the outputs, where this method's kernel does that (an LM head's greedy step); else None."""
        return None

    def row_table(self, layer: nn.Module) -> nn.Module | None:
        """A module whose ``rows_of(ids, dtype)`` reads weight rows back from the form this method holds,
        where that form alone can serve a tied embedding's lookup (the embedding then drops its own table);
        else None."""
        return None


@register_linear_method("unquantized")
class UnquantizedLinearMethod(LinearMethod):
    """A plain weight in the model's dtype ([out, in], like HF), one ``F.linear``."""

    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_size: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype, device=device), requires_grad=False)
        set_weight_attrs(weight, output_dim=0, input_dim=1)
        layer.register_parameter("weight", weight)
        register_bias(layer, bias, output_size, dtype, device)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        if type(self).apply is not UnquantizedLinearMethod.apply:  # a subclass multiplies its own way
            return super().bind(layer, bias)
        return bound_op_call(torch.ops.aten.linear.default, layer.weight, bias)
