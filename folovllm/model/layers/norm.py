"""RMSNorm, with the residual add fused in (the pre-norm block's ``x + residual`` then norm)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folovllm.model.layers.custom_op import CustomOp
from folovllm.model.layers.linear import WeightConfig


class RMSNorm(CustomOp):
    """RMSNorm computed in fp32 like HF; with ``residual`` it first adds it (fused-add variant).

    Kernel form: one op does both (the sum written into ``residual`` in place).
    """

    def __init__(self, hidden_size: int, eps: float, weights: WeightConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.ones(hidden_size, dtype=weights.dtype, device=weights.device), requires_grad=False
        )
        self.eps = eps

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        # One fused kernel in fp32, then HF's order: cast back, then scale by the weight.
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        out = h.to(x.dtype).mul_(self.weight)  # h is this call's own tensor: scale it in place
        return out if residual is None else (out, residual)

    def forward_kernel(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not x.is_contiguous():  # q/k norms get strided heads: the torch form
            return self.forward_native(x, residual)
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.add_rms_norm(residual, x, self.weight, self.eps), residual
