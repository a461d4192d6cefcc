"""Rotary position embedding (neox style, as HF Llama/Qwen's ``rotate_half``), with rope scaling."""
from __future__ import annotations

import math

import torch
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, -sin | sin) per token, full head width


def rope_inv_freq(rotary_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies for rotary embedding, with optional "linear", "llama3" or "freq_factors" scaling
    (a GGUF's ``rope_freqs``: each frequency divided by its own factor)."""
    # on the CPU in float64 whatever the target device, so every device gets the same table
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq.float()
    if rope_type == "linear":
        return (inv_freq / scaling["factor"]).float()
    if rope_type == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled).float()
    if rope_type == "freq_factors":
        factors = torch.tensor(scaling["factors"], dtype=torch.float64)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope freq_factors: {factors.numel()} factors for {inv_freq.numel()} frequencies")
        return (inv_freq / factors).float()
    raise ValueError(f"rope type {rope_type!r} is not supported; supported: default, linear, llama3, freq_factors")


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (HF Llama/Qwen ``rotate_half``), looked up by absolute position."""

    def __init__(
        self, head_dim: int, max_position: int, theta: float, scaling: dict | None, device: torch.device
    ) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32, device=device), inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        # full-width cos and sign-folded sin: rotary is then two multiplies and an add per tensor
        self.register_buffer("cos_sin", torch.cat([cos, cos, -sin, sin], dim=-1), persistent=False)
        # dtype -> (the buffer it was made from, the table in that dtype as [positions, 1, 2 * head_dim]): a
        # step's lookup is then one gather, with the values of gathering then casting; not a buffer itself,
        # it is remade when the buffer is replaced (``Module.to``)
        self._cos_sin_as: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos and signed sin (-sin | sin) per token, [T, 1, head_dim] each; looked up once per step."""
        source, table = self._cos_sin_as.get(dtype, (None, None))
        if source is not self.cos_sin:
            source = self.cos_sin
            table = source.to(dtype).unsqueeze(1)
            self._cos_sin_as[dtype] = source, table
        cos, signed_sin = table[positions].chunk(2, dim=-1)
        return cos, signed_sin


def apply_rotary(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate [T, H, D] by each token's angle: HF's ``x * cos + rotate_half(x) * sin``, bit for bit.

    ``rotate_half(x) * sin`` is computed as ``[x2, x1] * [-sin, sin]``: negating a factor is exact,
    so each half is rounded exactly as ``x1 * cos - x2 * sin`` and ``x2 * cos + x1 * sin`` are.
    """
    cos, signed_sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([x2, x1], dim=-1) * signed_sin
