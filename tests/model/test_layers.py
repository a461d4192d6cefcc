"""Decoder pieces computed with fewer ops than transformers' formulas, yet bit for bit equal to them."""
from __future__ import annotations

import pytest
import torch

from folovllm.model.layers import RotaryEmbedding, apply_rotary


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_rotary_is_bitwise_hf(dtype: torch.dtype, tokens: int) -> None:
    torch.manual_seed(tokens)
    rotary = RotaryEmbedding(16, 128, 10000.0, None, torch.device("cpu"))
    positions = torch.randint(0, 128, (tokens,))
    x = torch.randn(tokens, 3, 16, dtype=dtype)
    rope = rotary(positions, dtype)
    cos, sin = rope[0], rope[1][..., 8:].repeat(1, 1, 2)  # HF's cat(freqs, freqs) tables
    assert torch.equal(cos[..., :8], cos[..., 8:])
    expected = x * cos + rotate_half(x) * sin  # transformers' apply_rotary_pos_emb
    assert torch.equal(apply_rotary(x, rope), expected)


def test_rotary_lookup_equals_casting_the_gathered_rows() -> None:
    rotary = RotaryEmbedding(16, 64, 10000.0, None, torch.device("cpu"))
    positions = torch.tensor([0, 5, 63, 5])
    for dtype in (torch.bfloat16, torch.float32, torch.bfloat16):  # a cached table, then another dtype's
        cos, sin = rotary(positions, dtype)
        want = rotary.cos_sin[positions].to(dtype).unsqueeze(1)
        assert cos.dtype == dtype and torch.equal(cos, want[..., :16]) and torch.equal(sin, want[..., 16:])
        assert cos.stride() == want[..., :16].stride()  # the fused rotary op reads rows of this stride
    rotary.to(torch.float64)  # a replaced buffer: its table is made again
    assert torch.equal(rotary(positions, torch.float64)[0], rotary.cos_sin[positions].unsqueeze(1)[..., :16])
