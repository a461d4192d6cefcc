"""The uniform integer grid of a weight group, and round-to-nearest (RTN) quantization on it.

A group is ``group_size`` consecutive input channels (the last may be shorter) of every output row;
each (group, row) pair has its own scale and integer zero point, and a weight is stored as the code
``clamp(round(w / scale) + zero, 0, 2**bits - 1)``, read back as ``(code - zero) * scale``.

The grid spans the group's min/max, or with a clipping search the shrunk range (the same fraction of
min and max) whose rounding error is lowest: a few outliers then stop stretching every step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

QUANT_BITS = (4, 8)
# off: min/max; mse: the range with the least sum |error|^2.4 (the GPTQ paper's code uses that norm);
# hmse: the least sum c_j error^2, c_j what an error in input j costs the layer's output (GPTQ only)
CLIP_MODES = ("off", "mse", "hmse")
CLIP_STEPS = 100  # candidate ranges shrink the min/max by 1 / CLIP_STEPS each
CLIP_MAX_SHRINK = 0.8  # the smallest candidate is 1 - CLIP_MAX_SHRINK of the min/max
_MSE_NORM = 2.4
_FP16_TINY = torch.finfo(torch.float16).tiny


@dataclass(frozen=True)
class QuantSpec:
    """The grid: bits per weight, input channels per group (-1: one group per row), symmetric or
    not, and how each group's range is chosen (``clip``, one of ``CLIP_MODES``)."""

    bits: int
    group_size: int
    sym: bool = True
    clip: str = "off"

    def __post_init__(self) -> None:
        if self.bits not in QUANT_BITS:
            raise ValueError(f"bits must be one of {QUANT_BITS}, got {self.bits}")
        if self.group_size != -1 and self.group_size <= 0:
            raise ValueError(f"group size must be -1 (one group per row) or positive, got {self.group_size}")
        if self.clip not in CLIP_MODES:
            raise ValueError(f"clip must be one of {CLIP_MODES}, got {self.clip!r}")

    @property
    def maxq(self) -> int:
        """The largest code."""
        return 2**self.bits - 1

    def group_width(self, in_features: int) -> int:
        """Input channels per group for a layer with ``in_features`` inputs."""
        return in_features if self.group_size == -1 else self.group_size

    def num_groups(self, in_features: int) -> int:
        """Groups per row; when the width does not divide ``in_features`` the last group is shorter
        (as GPTQ tools do, e.g. 576 inputs in groups of 128: four full groups and one of 64)."""
        return -(-in_features // self.group_width(in_features))


@dataclass
class QuantizedWeight:
    """A [out, in] weight as integer codes with per-(group, row) scales and zero points.

    ``g_idx[i]`` is the group of input channel ``i``: ``i // group_size``, or with act-order the
    group of the position channel ``i`` was quantized at.
    """

    codes: torch.Tensor  # int32 [out, in], in [0, 2**bits)
    scales: torch.Tensor  # float32 [groups, out], each exactly representable in float16
    zeros: torch.Tensor  # int32 [groups, out], in [1, 2**bits) (the checkpoint stores zero - 1)
    g_idx: torch.Tensor  # int32 [in]

    def dequantize(self) -> torch.Tensor:
        """The float32 [out, in] weight the codes stand for."""
        idx = self.g_idx.long()
        return (self.codes - self.zeros[idx].T).float() * self.scales[idx].T

    def split_rows(self, sizes: list[int]) -> list[QuantizedWeight]:
        """The weights of consecutive blocks of output rows (q/k/v or gate/up of a merged linear)."""
        return [QuantizedWeight(codes, scales, zeros, self.g_idx)
                for codes, scales, zeros in zip(self.codes.split(sizes, dim=0), self.scales.split(sizes, dim=1),
                                                self.zeros.split(sizes, dim=1), strict=True)]


def group_grid(w: torch.Tensor, spec: QuantSpec, col_weights: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of ``w`` [rows, group] (0 always on the grid).

    The range is the rows' min/max, or with ``spec.clip`` the shrunk range of least error;
    ``col_weights`` [group] (each input's error cost, from the Hessian) is needed by ``hmse`` alone.
    """
    xmin = w.amin(dim=1).clamp(max=0)
    xmax = w.amax(dim=1).clamp(min=0)
    if spec.clip == "off":
        return range_grid(xmin, xmax, spec)
    if spec.clip == "hmse" and col_weights is None:
        raise ValueError("clip 'hmse' weighs errors by the inputs' Hessian: only GPTQ has one (use 'mse')")
    best_scale, best_zero = range_grid(xmin, xmax, spec)
    best_err = _grid_error(w, best_scale, best_zero, spec, col_weights)
    for step in range(1, int(CLIP_MAX_SHRINK * CLIP_STEPS)):
        keep = 1 - step / CLIP_STEPS
        scale, zero = range_grid(keep * xmin, keep * xmax, spec)
        err = _grid_error(w, scale, zero, spec, col_weights)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero, best_zero)
    return best_scale, best_zero


def _grid_error(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, spec: QuantSpec,
                col_weights: torch.Tensor | None) -> torch.Tensor:
    """Per row: the rounding error of ``w`` on the grid, in ``spec.clip``'s measure."""
    scale, zero = scale[:, None], zero[:, None]
    # quantize_codes, then dequantize and subtract, in place: this runs ~80 times per group
    err = torch.div(w, scale).round_().add_(zero).clamp_(0, spec.maxq).sub_(zero).mul_(scale).sub_(w)
    if spec.clip == "hmse":
        return err.square_().mul_(col_weights).sum(dim=1)
    return err.abs_().pow_(_MSE_NORM).sum(dim=1)


def range_grid(xmin: torch.Tensor, xmax: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row covering [``xmin``, ``xmax``] (xmin <= 0 <= xmax), float16-exact scales."""
    if spec.sym:
        scale = torch.maximum(-xmin, xmax) * 2 / spec.maxq
    else:
        scale = (xmax - xmin) / spec.maxq
    scale = torch.where(scale > 0, scale, 1.0)  # an all-zero row: any scale codes it exactly
    scale = _fp16_at_least(scale)
    if spec.sym:
        return scale, torch.full_like(scale, (spec.maxq + 1) // 2)
    zero = torch.round(-xmin / scale)
    # the checkpoint stores zero - 1, so zero 0 cannot be written: such a row gets zero 1 and a
    # scale that still reaches its maximum (its minimum lies within half a step of 0, so stays covered)
    low = zero < 1
    if low.any():
        scale = torch.where(low, _fp16_at_least(xmax / (spec.maxq - 1)), scale)
        zero = torch.where(low, 1.0, zero)
    return scale, zero.clamp(max=spec.maxq)


def _fp16_at_least(scale: torch.Tensor) -> torch.Tensor:
    """The smallest float16 value >= ``scale``, as float32: the checkpoint holds float16 scales, and
    one rounded down would push the range's ends past the last code (an error over half a step)."""
    half = scale.clamp(min=_FP16_TINY).half()
    up = torch.nextafter(half, torch.full_like(half, float("inf")))
    return torch.where(half.float() < scale, up, half).float()


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """Float codes on the grid: ``w`` [rows] or [rows, cols], per-row ``scale`` and ``zero`` [rows]."""
    if w.dim() == 2:
        scale, zero = scale[:, None], zero[:, None]
    return torch.clamp(torch.round(w / scale) + zero, 0, maxq)


def rtn_quantize(weight: torch.Tensor, spec: QuantSpec) -> QuantizedWeight:
    """Round every weight to the nearest point of its group's grid (no calibration data)."""
    w = weight.float()
    out_features, in_features = w.shape
    size = spec.group_width(in_features)
    codes, scales, zeros = torch.empty_like(w), [], []
    for start in range(0, in_features, size):
        scale, zero = group_grid(w[:, start:start + size], spec)
        codes[:, start:start + size] = quantize_codes(w[:, start:start + size], scale, zero, spec.maxq)
        scales.append(scale)
        zeros.append(zero)
    return QuantizedWeight(
        codes=codes.to(torch.int32),
        scales=torch.stack(scales),
        zeros=torch.stack(zeros).to(torch.int32),
        g_idx=(torch.arange(in_features) // size).to(torch.int32),
    )
