"""The written GPTQ tensors: v1 layout, shapes, and the dequantization formula over a pack/unpack round trip."""
from __future__ import annotations

import pytest
import torch

from folovllm.model.quantization.pack import unpack_int32
from folovllm.quantize.checkpoint import (
    dequantize_gptq,
    dequantize_state_dict,
    gptq_tensors,
)
from folovllm.quantize.gptq import GPTQConfig, gptq_quantize
from folovllm.quantize.grid import QuantSpec, rtn_quantize


def formula(tensors: dict[str, torch.Tensor], name: str, bits: int) -> torch.Tensor:
    """W[o, i] = (q[i, o] - (qzeros[g_idx[i], o] + 1)) * scales[g_idx[i], o], one element at a time."""
    q = unpack_int32(tensors[f"{name}.qweight"], bits, dim=0)
    z = unpack_int32(tensors[f"{name}.qzeros"], bits, dim=1)
    scales, g_idx = tensors[f"{name}.scales"], tensors[f"{name}.g_idx"]
    out = torch.empty(q.shape[1], q.shape[0])
    for o in range(q.shape[1]):
        for i in range(q.shape[0]):
            g = int(g_idx[i])
            out[o, i] = (int(q[i, o]) - (int(z[g, o]) + 1)) * float(scales[g, o])
    return out


@pytest.mark.parametrize(("bits", "sym", "act_order"), [(4, True, False), (4, False, True), (8, True, True)])
def test_written_tensors_follow_the_v1_formula(bits: int, sym: bool, act_order: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 48, generator=gen) * torch.linspace(0.1, 3, 48)
    w = torch.randn(16, 48, generator=gen)
    spec = QuantSpec(bits, 32, sym)  # 48 inputs: groups of 32 and 16
    quantized, _ = gptq_quantize(w, 2 * x.T @ x, GPTQConfig(spec, act_order=act_order))
    tensors = gptq_tensors("layer", quantized, bits)

    per_int = 32 // bits
    assert tensors["layer.qweight"].shape == (48 // per_int, 16) and tensors["layer.qweight"].dtype == torch.int32
    assert tensors["layer.qzeros"].shape == (2, 16 // per_int) and tensors["layer.qzeros"].dtype == torch.int32
    assert tensors["layer.scales"].shape == (2, 16) and tensors["layer.scales"].dtype == torch.float16
    assert tensors["layer.g_idx"].shape == (48,) and tensors["layer.g_idx"].dtype == torch.int32
    stored_zeros = unpack_int32(tensors["layer.qzeros"], bits, dim=1)
    assert torch.equal(stored_zeros + 1, quantized.zeros)  # v1 stores zero - 1
    if sym:
        assert torch.all(stored_zeros == 2 ** (bits - 1) - 1)

    expected = formula(tensors, "layer", bits)
    torch.testing.assert_close(dequantize_gptq(tensors, "layer", bits), expected, rtol=0, atol=0)
    torch.testing.assert_close(quantized.dequantize(), expected, rtol=0, atol=0)  # what GPTQ compensated for


def test_dequantized_state_dict_keeps_plain_tensors_and_biases() -> None:
    w = torch.randn(8, 32)
    tensors = {
        **gptq_tensors("model.layers.0.mlp.down_proj", rtn_quantize(w, QuantSpec(4, 16)), 4),
        "model.layers.0.mlp.down_proj.bias": torch.ones(8, dtype=torch.float16),
        "model.norm.weight": torch.ones(32, dtype=torch.float16),
    }
    plain = dequantize_state_dict(tensors, bits=4)
    assert set(plain) == {"model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.bias",
                          "model.norm.weight"}
    assert plain["model.layers.0.mlp.down_proj.weight"].shape == (8, 32)
    assert (plain["model.layers.0.mlp.down_proj.weight"] - w).abs().max() < 0.5
