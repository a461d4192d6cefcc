"""GPTQ on one linear: lower output error than round-to-nearest, act-order, dead inputs, lazy batches."""
from __future__ import annotations

import pytest
import torch

from folovllm.quantize.gptq import GPTQConfig, gptq_quantize
from folovllm.quantize.grid import QuantizedWeight, QuantSpec, rtn_quantize


def correlated_inputs(tokens: int, features: int, seed: int = 0) -> torch.Tensor:
    """Inputs mixed through a random matrix, with channel scales spread over a decade (like activations)."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(features, features, generator=gen) / features**0.5
    scales = 10 ** torch.rand(features, generator=gen)
    return (torch.randn(tokens, features, generator=gen) @ mix) * scales


@pytest.fixture(scope="module")
def layer() -> tuple[torch.Tensor, torch.Tensor]:
    x = correlated_inputs(512, 128)
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(1))
    return x, w


def output_error(x: torch.Tensor, w: torch.Tensor, q: QuantizedWeight) -> float:
    return float((x @ w.T - x @ q.dequantize().T).norm())


@pytest.mark.parametrize("sym", [True, False])
def test_gptq_beats_rtn_at_4_bits_g32(layer: tuple[torch.Tensor, torch.Tensor], sym: bool) -> None:
    x, w = layer
    spec = QuantSpec(bits=4, group_size=32, sym=sym)
    rtn = output_error(x, w, rtn_quantize(w, spec))
    gptq, _ = gptq_quantize(w, 2 * x.T @ x, GPTQConfig(spec))
    ordered, _ = gptq_quantize(w, 2 * x.T @ x, GPTQConfig(spec, act_order=True))
    assert output_error(x, w, gptq) < 0.85 * rtn
    assert output_error(x, w, ordered) < 0.85 * rtn


def test_act_order_groups_follow_the_quantization_order(layer: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, w = layer
    h = 2 * x.T @ x
    q, _ = gptq_quantize(w, h, GPTQConfig(QuantSpec(4, 32), act_order=True))
    order = torch.argsort(h.diagonal(), descending=True)
    assert torch.equal(q.g_idx[order].long(), torch.arange(128) // 32)  # i-th quantized channel: group i // 32
    assert q.scales.shape == (4, 48) and q.zeros.shape == (4, 48)
    plain, _ = gptq_quantize(w, h, GPTQConfig(QuantSpec(4, 32)))
    assert torch.equal(plain.g_idx.long(), torch.arange(128) // 32)


def test_lazy_batches_change_nothing(layer: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, w = layer
    h = 2 * x.T @ x
    spec = QuantSpec(4, 32)
    lazy, _ = gptq_quantize(w, h, GPTQConfig(spec, block_size=128))
    eager, _ = gptq_quantize(w, h, GPTQConfig(spec, block_size=1))
    mismatched = (lazy.codes != eager.codes).float().mean()
    assert mismatched < 0.01  # float rounding may tip a rare code across a rounding boundary


def test_dead_inputs_quantize_to_zero() -> None:
    x = correlated_inputs(256, 64)
    x[:, [3, 40]] = 0
    w = torch.randn(16, 64)
    q, _ = gptq_quantize(w, 2 * x.T @ x, GPTQConfig(QuantSpec(4, 16)))
    assert torch.all(q.dequantize()[:, [3, 40]] == 0)
    assert torch.isfinite(q.dequantize()).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_codes_and_grid_stay_in_range(layer: tuple[torch.Tensor, torch.Tensor], bits: int) -> None:
    x, w = layer
    for sym in (True, False):
        q, _ = gptq_quantize(w, 2 * x.T @ x, GPTQConfig(QuantSpec(bits, 32, sym)))
        assert 0 <= int(q.codes.min()) and int(q.codes.max()) < 2**bits
        assert 1 <= int(q.zeros.min()) and int(q.zeros.max()) < 2**bits  # zero - 1 must fit in bits
        assert torch.equal(q.scales, q.scales.half().float())  # float16 scales lose nothing on writing


def test_8_bits_is_nearly_exact(layer: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, w = layer
    q, _ = gptq_quantize(w, 2 * x.T @ x, GPTQConfig(QuantSpec(8, 32)))
    assert output_error(x, w, q) < 0.01 * float((x @ w.T).norm())


def test_a_short_last_group_and_one_group_per_row() -> None:
    x = correlated_inputs(256, 80)
    w = torch.randn(8, 80)
    q, _ = gptq_quantize(w, 2 * x.T @ x, GPTQConfig(QuantSpec(4, 32)))  # groups of 32, 32, 16
    assert q.scales.shape == (3, 8) and int(q.g_idx.max()) == 2
    whole, _ = gptq_quantize(w, 2 * x.T @ x, GPTQConfig(QuantSpec(4, -1)))
    assert whole.scales.shape == (1, 8) and int(whole.g_idx.max()) == 0


def test_rtn_rounds_to_the_nearest_grid_point() -> None:
    w = torch.randn(8, 64)
    q = rtn_quantize(w, QuantSpec(4, 16, sym=False))
    deq = q.dequantize()
    step = q.scales[q.g_idx.long()].T
    assert torch.all((w - deq).abs() <= step / 2 + 1e-6)


def test_a_singular_hessian_without_damping_is_a_clear_error() -> None:
    x = correlated_inputs(8, 64)  # fewer tokens than inputs: rank 8
    with pytest.raises(ValueError, match="raise --damp"):
        gptq_quantize(torch.randn(8, 64), 2 * x.T @ x, GPTQConfig(QuantSpec(4, 16), damp=0.0))


def test_bad_grid_settings() -> None:
    with pytest.raises(ValueError, match="bits must be one of"):
        QuantSpec(bits=3, group_size=128)
    with pytest.raises(ValueError, match="group size must be -1"):
        QuantSpec(bits=4, group_size=0)
    with pytest.raises(ValueError, match="damp"):
        GPTQConfig(QuantSpec(4, 128), damp=-0.1)
