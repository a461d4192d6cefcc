"""GPTQ parameters in the linear layers: packed shard offsets, tensor-parallel slices."""
from __future__ import annotations

import pytest
import torch

from folovllm.model.layers.linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
    WeightConfig,
)
from folovllm.model.quantization.gptq import GPTQLinearMethod
from folovllm.model.quantization.gptq_config import GPTQConfig


def _weights(tp_rank: int = 0, tp_size: int = 1, **config) -> WeightConfig:
    cfg = GPTQConfig.from_dict({"bits": 4, "group_size": 32, **config})
    return WeightConfig(torch.float32, torch.device("cpu"), GPTQLinearMethod(cfg), tp_rank, tp_size)


def test_merged_pieces_land_at_packed_offsets() -> None:
    layer = MergedColumnParallelLinear(64, [16, 32], bias=False, weights=_weights())
    assert layer.qweight.shape == (8, 48) and layer.qzeros.shape == (2, 6)
    zeros = torch.arange(2 * 4, dtype=torch.int32).reshape(2, 4)  # piece 1: 32 outputs = 4 packed columns
    layer.weight_loader(layer.qzeros, zeros, 1)
    assert torch.equal(layer.qzeros.data[:, 2:], zeros)  # after piece 0's 16 outputs = 2 packed columns
    scales = torch.rand(2, 32)
    layer.weight_loader(layer.scales, scales, 1)
    assert torch.equal(layer.scales.data[:, 16:], scales)


def test_shard_boundary_inside_a_packed_element_is_an_error() -> None:
    layer = MergedColumnParallelLinear(64, [12, 4], bias=False, weights=_weights())  # 16 outputs in all
    with pytest.raises(ValueError, match="shard boundary at 12 outputs falls inside a packed element"):
        layer.weight_loader(layer.qzeros, torch.zeros(2, 0, dtype=torch.int32), 1)


def test_sizes_not_divisible_by_the_pack_factor_are_an_error() -> None:
    with pytest.raises(ValueError, match="4-bit GPTQ linear needs sizes divisible by 8"):
        RowParallelLinear(60, 16, bias=False, weights=_weights())


def test_row_parallel_rank_keeps_its_rows_and_groups() -> None:
    layer = RowParallelLinear(128, 16, bias=False, weights=_weights(tp_rank=1, tp_size=2))
    qweight = torch.arange(16 * 16, dtype=torch.int32).reshape(16, 16)  # 128 inputs / 8 per int32
    layer.weight_loader(layer.qweight, qweight)
    assert torch.equal(layer.qweight.data, qweight[8:])
    scales = torch.rand(4, 16)  # 128 inputs in groups of 32
    layer.weight_loader(layer.scales, scales)
    assert torch.equal(layer.scales.data, scales[2:])
    g_idx = torch.arange(128, dtype=torch.int32) // 32
    layer.weight_loader(layer.g_idx, g_idx)
    assert torch.equal(layer.g_idx.data, g_idx[64:])
    layer.weight_loader(layer.qzeros, torch.zeros(4, 2, dtype=torch.int32))
    layer.method.process_weights_after_loading(layer)  # this rank's g_idx (groups 2, 3) reads its scales 0, 1
    x = torch.zeros(1, 64)
    assert layer.quant_kernel(x).shape == (1, 16)


def test_act_order_row_parallel_rank_holds_every_group() -> None:
    layer = RowParallelLinear(128, 16, bias=False, weights=_weights(tp_rank=1, tp_size=2, desc_act=True))
    scales = torch.rand(4, 16)
    layer.weight_loader(layer.scales, scales)
    assert torch.equal(layer.scales.data, scales)
