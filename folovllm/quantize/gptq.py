"""GPTQ (Frantar et al., 2022): quantize a linear's weight column by column, each rounding error
spread over the not-yet-quantized columns through the inverse Hessian of the layer's inputs.

For inputs X [tokens, in], the layer's output error ||X W^T - X Q^T||^2 is a quadratic form in
W - Q with Hessian H = 2 X^T X. Quantizing column j leaves the error w_j - q_j; the remaining
columns absorb it by the row j of the upper Cholesky factor of H^-1, which also gives the
scaling d_j. Updates to columns past the current block wait and are applied as one matmul.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from folovllm.quantize.grid import QuantizedWeight, QuantSpec, group_grid, quantize_codes


@dataclass(frozen=True)
class GPTQConfig:
    """How GPTQ runs: the grid, damping, column order and lazy-update block width."""

    spec: QuantSpec
    damp: float = 0.01  # fraction of the mean Hessian diagonal added to the diagonal
    act_order: bool = False  # quantize columns by descending Hessian diagonal (largest inputs first)
    block_size: int = 128  # columns per lazy batch; 1 applies every update at once (same result, slower)

    def __post_init__(self) -> None:
        if not 0 <= self.damp < 1:
            raise ValueError(f"damp must lie in [0, 1), got {self.damp}")
        if self.block_size <= 0:
            raise ValueError(f"block size must be positive, got {self.block_size}")


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, config: GPTQConfig) -> tuple[QuantizedWeight, float]:
    """Quantize ``weight`` [out, in] given ``hessian`` [in, in] (2 X^T X of its inputs).

    Returns the quantized weight and GPTQ's own error estimate, sum over rows of
    sum_j (w_j - q_j)^2 / d_j^2 / 2 (comparable between layers of one model, not between models).
    """
    with _one_thread():
        return _gptq(weight.detach().float().clone(), hessian.detach().float().clone(), config)


@contextmanager
def _one_thread() -> Iterator[None]:
    # the column loop is thousands of small vector ops: extra threads only wait on each other
    # (measured 20x slower with 2 threads on a busy 2-core machine)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _gptq(w: torch.Tensor, h: torch.Tensor, config: GPTQConfig) -> tuple[QuantizedWeight, float]:
    out_features, in_features = w.shape
    if h.shape != (in_features, in_features):
        raise ValueError(f"hessian has shape {tuple(h.shape)}, expected ({in_features}, {in_features})")
    spec = config.spec
    group = spec.group_width(in_features)

    dead = h.diagonal() == 0  # inputs that were always zero: any weight does; quantize them to 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(h.diagonal(), descending=True) if config.act_order else None
    if perm is not None:
        w, h = w[:, perm], h[perm][:, perm]
    h.diagonal().add_(config.damp * h.diagonal().mean())
    u = _upper_cholesky_of_inverse(h)
    # what an error in column j costs once later columns compensate (the weight of GPTQ's own loss)
    cost = u.diagonal().square().reciprocal()

    codes = torch.empty_like(w)
    scales = torch.empty(spec.num_groups(in_features), out_features)
    zeros = torch.empty(spec.num_groups(in_features), out_features)
    loss = torch.zeros(out_features)
    scale = zero = None
    for start in range(0, in_features, config.block_size):
        end = min(start + config.block_size, in_features)
        errors = torch.empty(out_features, end - start)
        for j in range(start, end):
            if j % group == 0:  # a group's grid comes from its columns as they stand when it starts
                scale, zero = group_grid(w[:, j:j + group], spec, cost[j:j + group])
                scales[j // group], zeros[j // group] = scale, zero
            col = w[:, j]
            code = quantize_codes(col, scale, zero, spec.maxq)
            codes[:, j] = code
            err = (col - (code - zero) * scale) / u[j, j]
            loss += err.square() / 2
            w[:, j + 1:end] -= torch.outer(err, u[j, j + 1:end])
            errors[:, j - start] = err
        w[:, end:] -= errors @ u[start:end, end:]

    position = torch.arange(in_features)
    if perm is not None:
        position = torch.argsort(perm)  # where each input channel sits in the quantization order
        codes = codes[:, position]
    quantized = QuantizedWeight(codes=codes.to(torch.int32), scales=scales, zeros=zeros.to(torch.int32),
                                g_idx=(position // group).to(torch.int32))
    return quantized, float(loss.sum())


def _upper_cholesky_of_inverse(h: torch.Tensor) -> torch.Tensor:
    """U with U^T U = H^-1, computed in float64 (H of a few thousand tokens is badly conditioned)."""
    try:
        lower = torch.linalg.cholesky(h.double())
        return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True).float()
    except torch.linalg.LinAlgError as e:
        raise ValueError(f"the damped Hessian is not positive definite ({e}); raise --damp or use more "
                         "calibration tokens") from e
