"""Batch-invariant linears: a row's outputs do not depend on how many rows a call multiplies or where the row
sits among them (the torch form in fixed row tiles; our kernel's is tests/model/test_cpu_bf16_linear.py's), and
what the CPU platform picks and refuses in batch-invariant mode."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from folovllm.model.quantization.packed import ROW_TILE, PackedLinearMethod, dense_method, row_tiled_linear
from folovllm.platforms import platform_for
from tests.helpers import switches
from tests.tiers import kernel_missing

torch.set_num_threads(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features,in_features", [(576, 576), (100, 72), (1536, 96)])
def test_row_tiles_give_a_row_the_same_bits_in_any_call(dtype: torch.dtype, out_features: int,
                                                        in_features: int, engine_tier: str) -> None:
    gen = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=gen).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype)
    x = torch.randn(3 * ROW_TILE + 5, in_features, generator=gen).to(dtype)
    needle = x[7:8]
    alone = row_tiled_linear(needle, weight, bias)
    for rows in (2, ROW_TILE - 1, ROW_TILE, ROW_TILE + 1, 2 * ROW_TILE + 3):
        for at in (0, rows // 2, rows - 1):  # first, middle and last row of a call, of a tile
            batch = torch.cat([x[:at], needle, x[at + 1:rows]]) if rows <= x.shape[0] else None
            assert torch.equal(row_tiled_linear(batch, weight, bias)[at], alone[0])
    torch.testing.assert_close(alone, F.linear(needle, weight, bias), atol=1e-2, rtol=1e-2)
    assert row_tiled_linear(x.view(1, -1, in_features), weight, None).shape == (1, x.shape[0], out_features)


def test_invariant_kernels_pack_what_our_kernel_takes_and_tile_the_rest() -> None:
    platform = platform_for("cpu", batch_invariant=True)
    kernels = platform.linear_kernels(torch.bfloat16)
    assert kernels.row_invariant and kernels.dense_fallback == "torch"
    method = dense_method(kernels)
    assert isinstance(method, PackedLinearMethod) and method.row_tiles and not method.onednn
    fp32 = platform.linear_kernels(torch.float32)
    assert fp32.dense == "torch" and fp32.row_invariant  # our kernel holds bf16 weights only

    class Layer(torch.nn.Module):
        pass

    for shape in ((128, 64), (100, 64)):  # one our kernel takes, one it does not (100 rows)
        layer = Layer()
        layer.weight = torch.nn.Parameter(torch.randn(*shape, dtype=torch.bfloat16), requires_grad=False)
        plain = layer.weight.detach().clone()
        method.process_weights_after_loading(layer)
        x = torch.randn(5, 64, dtype=torch.bfloat16)
        assert torch.equal(method.apply(layer, x, None)[2:3], method.apply(layer, x[2:3], None))
        assert torch.equal(method.bind(layer, None)(x), method.apply(layer, x, None))
        torch.testing.assert_close(method.apply(layer, x, None), F.linear(x, plain), atol=0.1, rtol=0.05)
    if kernel_missing("linear") is None:  # an AMX host's linear kernel takes many rows apart: torch's tiles there
        assert kernels.dense == ("torch" if torch.ops.folovllm.has_kernel("linear_amx") else "folovllm")


def test_invariant_mode_refuses_what_has_no_invariant_form() -> None:
    platform = platform_for("cpu", batch_invariant=True)
    with pytest.raises(ValueError, match="float weights only"):
        platform.linear_kernels(torch.bfloat16, "auto", quantized_linears=True)
    with pytest.raises(ValueError, match="float weights only"):
        platform.linear_kernels(torch.bfloat16, "on")
    with switches(CPU_LINEAR="onednn"):
        with pytest.raises(ValueError, match="oneDNN's GEMMs block by the row count"):
            platform_for("cpu", batch_invariant=True).linear_kernels(torch.float32)
    with switches(CPU_LINEAR="torch"):
        assert platform_for("cpu", batch_invariant=True).linear_kernels(torch.bfloat16).dense == "torch"
    if kernel_missing("linear") is None and torch.ops.folovllm.has_kernel("linear_amx"):
        with switches(CPU_LINEAR="folovllm"), pytest.raises(ValueError, match="cannot run batch-invariant on this AMX"):
            platform_for("cpu", batch_invariant=True).linear_kernels(torch.bfloat16)
    assert platform.describe()["batch_invariant"] == "on"
    assert "batch_invariant" not in platform_for("cpu").describe()
