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
