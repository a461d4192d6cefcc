"""The group grid: symmetric zero points, and the clipping search (mse, hmse) against plain min/max."""
from __future__ import annotations

import pytest
import torch

from folovllm.quantize.gptq import GPTQConfig, gptq_quantize
from folovllm.quantize.grid import QuantSpec, group_grid, quantize_codes, rtn_quantize


def heavy_tailed(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Student-t weights (3 degrees of freedom): a few outliers per row stretch the min/max."""
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(rows, cols, generator=gen)
    chi2 = torch.randn(rows, cols, 3, generator=gen).square().sum(-1)
    return normal / (chi2 / 3).sqrt()


def grid_error(w: torch.Tensor, spec: QuantSpec, col_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Per row: sum of squared rounding errors (weighted by ``col_weights``) on the group's grid."""
    scale, zero = group_grid(w, spec, col_weights)
    err = (quantize_codes(w, scale, zero, spec.maxq) - zero[:, None]) * scale[:, None] - w
    weights = torch.ones(w.shape[1]) if col_weights is None else col_weights
    return (err.square() * weights).sum(dim=1)


@pytest.mark.parametrize("bits", [4, 8])
def test_symmetric_zero_point_is_the_middle_code(bits: int) -> None:
    _, zero = group_grid(heavy_tailed(8, 32), QuantSpec(bits, 32, sym=True))
    assert torch.all(zero == 2 ** (bits - 1))  # 8 for 4-bit, 128 for 8-bit: what GPTQ kernels assume


@pytest.mark.parametrize("sym", [True, False])
def test_mse_clipping_lowers_the_rounding_error_of_heavy_tails(sym: bool) -> None:
    w = heavy_tailed(256, 128)
    plain = grid_error(w, QuantSpec(4, 128, sym))
    clipped = grid_error(w, QuantSpec(4, 128, sym, clip="mse"))
    assert clipped.sum() < 0.95 * plain.sum()


def test_hmse_clipping_is_never_worse_than_min_max_in_its_own_measure() -> None:
    w = heavy_tailed(64, 128, seed=1)
    cost = 10 ** torch.rand(128, generator=torch.Generator().manual_seed(2))
    for sym in (True, False):
        plain = grid_error(w, QuantSpec(4, 128, sym), cost)
        clipped = grid_error(w, QuantSpec(4, 128, sym, clip="hmse"), cost)
        assert torch.all(clipped <= plain * (1 + 1e-6))  # min/max is one of the candidates


def test_clipped_grids_keep_codes_zero_points_and_scales_writable() -> None:
    w = heavy_tailed(64, 128, seed=3)
    w[0] = w[0].abs()  # a row with no negative weight: the asymmetric zero point must stay >= 1
    w[1] = 0
    for sym in (True, False):
        q = rtn_quantize(w, QuantSpec(4, 32, sym, clip="mse"))
        assert 0 <= int(q.codes.min()) and int(q.codes.max()) <= 15
        assert 1 <= int(q.zeros.min()) and int(q.zeros.max()) <= 15
        assert torch.equal(q.scales, q.scales.half().float())
        assert torch.all(q.dequantize()[1] == 0)


def test_gptq_with_hmse_clipping_lowers_output_error_on_heavy_tails() -> None:
    gen = torch.Generator().manual_seed(0)
    mix = torch.randn(128, 128, generator=gen) / 128**0.5
    x = torch.randn(1024, 128, generator=gen) @ mix * 10 ** torch.rand(128, generator=gen)  # uneven channels
    w = heavy_tailed(64, 128, seed=10)
    h = 2 * x.T @ x
    errors = {}
    for sym in (True, False):
        for clip in ("off", "hmse"):
            q, _ = gptq_quantize(w, h, GPTQConfig(QuantSpec(4, 64, sym=sym, clip=clip)))
            errors[sym, clip] = float((x @ (w - q.dequantize()).T).square().sum())
    assert errors[True, "hmse"] < 0.85 * errors[True, "off"]
    assert errors[False, "hmse"] < 0.95 * errors[False, "off"]


def test_hmse_needs_the_inputs_cost() -> None:
    with pytest.raises(ValueError, match="only GPTQ"):
        rtn_quantize(heavy_tailed(4, 32), QuantSpec(4, 32, clip="hmse"))
    with pytest.raises(ValueError, match="clip must be one of"):
        QuantSpec(4, 32, clip="minmax")


def test_float16_scales_never_push_a_group_end_past_the_last_code() -> None:
    # seeds where rounding each scale to the nearest float16 (down) clamped a group's largest weight
    # at code 15, more than half a step away
    for seed in (102, 129, 231, 299):
        w = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))
        q = rtn_quantize(w, QuantSpec(4, 16, sym=False))
        step = q.scales[q.g_idx.long()].T
        assert torch.all((w - q.dequantize()).abs() <= step / 2 + 1e-6)
        assert torch.equal(q.scales, q.scales.half().float())
