"""The int8 LM head (``quantize_lm_head``): codes, the tied lookup, logits, the switch and its auto rule."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from folovllm.config import EngineConfig
from folovllm.model.layers import CausalLM
from folovllm.model.loader import load_model
from folovllm.model.quantization.int8 import quantize_int8_per_channel
from folovllm.model.quantization.kernels import Int8ChannelKernel
from folovllm.model.quantization.lm_head import Int8HeadMethod
from folovllm.platforms import platform_for
from folovllm.platforms.cuda import CudaPlatform
from tests.model.test_loader import prefill_logits
from tests.tiers import kernel_missing

TINY = dict(architectures=["LlamaForCausalLM"], vocab_size=96, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, eos_token_id=2)
IDS = [5, 17, 3, 90, 42, 7, 0, 11]
CPU = torch.device("cpu")


def _tiny(tmp_path: Path, tied: bool, dtype: torch.dtype, quantize_lm_head: str, **kwargs) -> CausalLM:
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, tie_word_embeddings=tied)))
    return load_model(str(tmp_path), load_format="dummy", dtype=dtype, device="cpu", seed=3,
                      quantize_lm_head=quantize_lm_head, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_head_rows_round_to_nearest_against_the_rounded_scale(dtype: torch.dtype) -> None:
    weight = torch.randn(40, 64) * torch.logspace(-3, 0, 40)[:, None]
    weight[7] = 0  # a padded vocabulary row
    codes, scales = quantize_int8_per_channel(weight, dtype)
    assert codes.dtype == torch.int8 and scales.dtype == dtype and int(codes.abs().max()) <= 127
    assert scales[7] == 1 and not codes[7].any()
    s = scales.float()[:, None]
    err = (codes.float() * s - weight).abs()
    # a row's extreme weight may clamp at 127 when the scale rounded down: within a scale's rounding
    assert bool((err <= s / 2 + weight.abs() * 2**-7 + 1e-7).all())


@pytest.mark.parametrize("tied", [True, False])
def test_int8_head_equals_the_model_with_dequantized_head(tmp_path: Path, tied: bool) -> None:
    quantized = _tiny(tmp_path, tied, torch.float32, "on")
    dense = _tiny(tmp_path, tied, torch.float32, "off")
    head = dense.model.embed_tokens if tied else dense.lm_head
    codes, scales = quantize_int8_per_channel(head.weight.data, torch.float32)
    with torch.no_grad():
        head.weight.copy_(codes.float() * scales[:, None])  # what the int8 rows stand for
    assert isinstance(quantized.lm_head.method, Int8HeadMethod) and not hasattr(quantized.lm_head, "weight")
    if tied:
        embed = quantized.model.embed_tokens
        assert embed.row_table is quantized.lm_head.quant_kernel and not hasattr(embed, "weight")
        ids = torch.tensor(IDS)
        assert torch.equal(embed(ids), embed.row_table.rows_of(ids, torch.float32))
    torch.testing.assert_close(prefill_logits(quantized, IDS), prefill_logits(dense, IDS), rtol=1e-4, atol=1e-4)
    assert quantized.weight_bytes() < _tiny(tmp_path, tied, torch.float32, "off").weight_bytes()


@pytest.mark.parametrize("tied", [True, False])
def test_int8_head_bf16_close_to_bf16_head(tmp_path: Path, tied: bool) -> None:
    quantized = _tiny(tmp_path, tied, torch.bfloat16, "on", platform=platform_for("cpu"))
    dense = _tiny(tmp_path, tied, torch.bfloat16, "off", platform=platform_for("cpu"))
    got, expected = prefill_logits(quantized, IDS, torch.bfloat16), prefill_logits(dense, IDS, torch.bfloat16)
    torch.testing.assert_close(got.float(), expected.float(), atol=0.05 * float(expected.abs().max()), rtol=0.05)


def test_reference_kernel_switch(tmp_path: Path, monkeypatch) -> None:
    fast = _tiny(tmp_path, True, torch.float32, "on", platform=platform_for("cpu"))
    monkeypatch.setenv("FOLOVLLM_QUANT_KERNEL", "reference")
    forced = _tiny(tmp_path, True, torch.float32, "on", platform=platform_for("cpu"))
    assert forced.lm_head.quant_kernel.reference and not fast.lm_head.quant_kernel.reference
    torch.testing.assert_close(prefill_logits(forced, IDS), prefill_logits(fast, IDS), rtol=1e-4, atol=1e-4)


def test_auto_is_on_with_quantized_linears_on_the_cpu(tmp_path: Path) -> None:
    def int8_head(platform, choice: str, quantized_linears: bool) -> bool:
        return platform.linear_kernels(torch.float32, choice, quantized_linears).int8_lm_head

    cpu, cuda = platform_for("cpu"), CudaPlatform(torch.device("cuda"))
    assert int8_head(cpu, "auto", True) and not int8_head(cpu, "auto", False)
    assert not int8_head(cuda, "auto", True)
    assert int8_head(cpu, "on", False) and not int8_head(cpu, "off", True)
    int8 = _tiny(tmp_path, True, torch.float32, "auto", quantization="int8", platform=cpu)
    assert int8.model.embed_tokens.row_table is not None
    plain = _tiny(tmp_path, True, torch.float32, "auto", platform=cpu)
    assert plain.model.embed_tokens.row_table is None and plain.model.embed_tokens.weight.dtype == torch.float32


def test_bad_choice_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="quantize_lm_head must be"):
        _tiny(tmp_path, True, torch.float32, "int4")
    with pytest.raises(ValueError, match="quantize_lm_head must be"):
        _tiny(tmp_path, True, torch.float32, "int4", platform=platform_for("cpu"))
    with pytest.raises(ValueError, match="quantize_lm_head must be one of auto, on, off"):
        EngineConfig(quantize_lm_head="yes")


@pytest.mark.skipif(kernel_missing("int4") is not None, reason=f"{kernel_missing('int4')}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_int8_rows_op_equals_the_torch_ops(dtype: torch.dtype) -> None:
    weight = torch.randn(96, 64) * torch.logspace(-3, 1, 96)[:, None]
    kernel = Int8ChannelKernel(*quantize_int8_per_channel(weight, torch.bfloat16), None, "folovllm")
    assert kernel.ours
    ids = torch.tensor([[5, 17, 95], [0, 16, 31]])
    by_op = kernel.rows_of(ids, dtype)
    by_torch = (kernel.code_rows(ids).float() * kernel.scales[ids].float().unsqueeze(-1)).to(dtype)
    assert by_op.dtype == dtype and by_op.shape == (2, 3, 64)
    assert torch.equal(by_op, by_torch)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.ops.folovllm.int8_rows(kernel.codes, kernel.scales, torch.tensor([96]), dtype)
