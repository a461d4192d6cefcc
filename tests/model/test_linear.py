"""Linear layers: each parameter's weight_loader fills its shard / its rank's slice; methods by name."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from folovllm.model.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    WeightConfig,
)
from folovllm.model.quantization.linear_method import (
    LINEAR_METHODS,
    UnquantizedLinearMethod,
    get_linear_method,
    register_linear_method,
)

CPU = torch.device("cpu")


def weights(tp_rank: int = 0, tp_size: int = 1, dtype: torch.dtype = torch.float32) -> WeightConfig:
    return WeightConfig(dtype, CPU, UnquantizedLinearMethod(), tp_rank, tp_size)


def test_unquantized_is_registered_and_unknown_names_are_listed() -> None:
    assert isinstance(get_linear_method("unquantized"), UnquantizedLinearMethod)
    with pytest.raises(ValueError, match=r"quantization 'awq' is not supported; supported: \[.*'unquantized'"):
        get_linear_method("awq")
    with pytest.raises(ValueError, match="registered twice"):
        register_linear_method("unquantized")(UnquantizedLinearMethod)
    assert LINEAR_METHODS.get("unquantized") is UnquantizedLinearMethod


def test_replicated_linear_is_f_linear_and_casts_on_load() -> None:
    layer = ReplicatedLinear(8, 4, True, weights(dtype=torch.bfloat16))
    w, b = torch.randn(4, 8), torch.randn(4)
    layer.weight.weight_loader(layer.weight, w)
    layer.bias.weight_loader(layer.bias, b)
    assert layer.weight.dtype == torch.bfloat16 and torch.equal(layer.weight, w.to(torch.bfloat16))
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    with pytest.raises(ValueError, match=r"has shape \(4, 7\), expected \(4, 8\)"):
        layer.weight.weight_loader(layer.weight, torch.randn(4, 7))


def test_merged_gate_up_fills_each_slot() -> None:
    layer = MergedColumnParallelLinear(8, [6, 6], False, weights())
    gate, up = torch.randn(6, 8), torch.randn(6, 8)
    layer.weight.weight_loader(layer.weight, up, 1)
    layer.weight.weight_loader(layer.weight, gate, 0)
    assert torch.equal(layer.weight, torch.cat([gate, up]))
    assert layer.weight.shard_ids == (0, 1)
    with pytest.raises(ValueError, match="by pieces"):
        layer.weight.weight_loader(layer.weight, gate, 2)


def test_qkv_fills_q_k_v_slots_with_bias() -> None:
    layer = QKVParallelLinear(16, 4, 4, 2, True, weights())
    q, k, v = torch.randn(16, 16), torch.randn(8, 16), torch.randn(8, 16)
    qb, kb, vb = torch.randn(16), torch.randn(8), torch.randn(8)
    for shard, w, b in (("v", v, vb), ("q", q, qb), ("k", k, kb)):
        layer.weight.weight_loader(layer.weight, w, shard)
        layer.bias.weight_loader(layer.bias, b, shard)
    assert torch.equal(layer.weight, torch.cat([q, k, v])) and torch.equal(layer.bias, torch.cat([qb, kb, vb]))
    assert layer.weight.shard_ids == ("q", "k", "v") and (layer.num_heads, layer.num_kv_heads) == (4, 2)
    with pytest.raises(ValueError, match="by pieces"):
        layer.weight.weight_loader(layer.weight, q, 0)


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_tensor_parallel_rank_loads_its_slice(tp_rank: int) -> None:
    cfg = weights(tp_rank, 2)
    full = torch.randn(8, 6)

    column = ColumnParallelLinear(6, 8, False, cfg)
    column.weight.weight_loader(column.weight, full)
    assert torch.equal(column.weight, full.chunk(2, dim=0)[tp_rank])

    row = RowParallelLinear(8, 6, True, cfg)
    row.weight.weight_loader(row.weight, full.T)
    row.bias.weight_loader(row.bias, torch.ones(6))
    assert torch.equal(row.weight, full.T.chunk(2, dim=1)[tp_rank]) and torch.equal(row.bias, torch.ones(6))

    gate_up = MergedColumnParallelLinear(6, [4, 4], False, cfg)
    gate, up = full[:4], full[4:]
    gate_up.weight.weight_loader(gate_up.weight, gate, 0)
    gate_up.weight.weight_loader(gate_up.weight, up, 1)
    expected = torch.cat([gate.chunk(2)[tp_rank], up.chunk(2)[tp_rank]])
    assert torch.equal(gate_up.weight, expected)

    qkv = QKVParallelLinear(6, 2, 4, 2, False, cfg)
    q, k, v = torch.randn(8, 6), torch.randn(4, 6), torch.randn(4, 6)
    for shard, w in (("q", q), ("k", k), ("v", v)):
        qkv.weight.weight_loader(qkv.weight, w, shard)
    assert (qkv.num_heads, qkv.num_kv_heads) == (2, 1)
    assert torch.equal(qkv.weight, torch.cat([q.chunk(2)[tp_rank], k.chunk(2)[tp_rank], v.chunk(2)[tp_rank]]))
    with pytest.raises(RuntimeError, match="all-reduce"):  # no tp_group: this rank cannot sum its part
        row(torch.randn(1, 4))


def test_bad_tensor_parallel_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="tp_rank=2 must lie in"):
        weights(2, 2)
    with pytest.raises(ValueError, match="num_key_value_heads=3 is not divisible by tp_size=2"):
        QKVParallelLinear(8, 2, 6, 3, False, weights(0, 2))
    with pytest.raises(ValueError, match="num_key_value_heads=2 is fewer than tp_size=3"):
        QKVParallelLinear(8, 2, 6, 2, False, weights(0, 3))
    assert QKVParallelLinear(8, 2, 2, 1, False, weights(1, 2)).num_kv_heads == 1  # replicated


class TransposedLinearMethod(UnquantizedLinearMethod):
    """A stand-in for a prepacked format: loads the plain weight, then holds it [in, out]."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.weight = nn.Parameter(layer.weight.data.T.contiguous(), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = x @ layer.weight
        return out if bias is None else out + bias


def test_another_method_plugs_into_the_same_loaders() -> None:
    plain = QKVParallelLinear(16, 4, 4, 2, True, weights())
    packed = QKVParallelLinear(16, 4, 4, 2, True, WeightConfig(torch.float32, CPU, TransposedLinearMethod()))
    for shard, rows in (("q", 16), ("k", 8), ("v", 8)):
        w, b = torch.randn(rows, 16), torch.randn(rows)
        for layer in (plain, packed):
            layer.weight.weight_loader(layer.weight, w, shard)
            layer.bias.weight_loader(layer.bias, b, shard)
    packed.method.process_weights_after_loading(packed)
    assert packed.weight.shape == (16, 32)
    x = torch.randn(5, 16)
    torch.testing.assert_close(packed(x), plain(x))
