"""The gated MLP: gate and up projections merged into one matmul, an activation, the down projection."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from folovllm.model.layers.custom_op import CustomOp
from folovllm.model.layers.linear import MergedColumnParallelLinear, RowParallelLinear, WeightConfig

# HF activation names the gated MLP implements -> the function applied to the gate
_ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class GatedMLP(CustomOp):
    """down(act(gate) * up), gate and up in one merged matmul (shards 0 and 1); SiLU by default.

    Kernel form (SiLU only): the activation and product as one op."""

    def __init__(self, hidden_size: int, intermediate_size: int, weights: WeightConfig,
                 activation: str = "silu") -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"MLP activation {activation!r} is not supported; supported: {sorted(_ACTIVATIONS)}")
        self.activation, self.act = activation, _ACTIVATIONS[activation]
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=False, weights=weights
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, weights=weights)

    def takes_kernel_form(self) -> bool:
        return self.activation == "silu"

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate).mul_(up))

    def forward_kernel(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))
