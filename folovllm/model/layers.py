"""Shared transformer layers for Llama-family decoders; architecture files only pick options."""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import ArchConfig

KVCache = tuple[torch.Tensor, torch.Tensor]
Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) per token


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 like HF; with ``residual`` it first adds it (fused-add variant)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        # One fused kernel in fp32, then HF's order: cast back, then scale by the weight.
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        out = self.weight * h.to(x.dtype)
        return out if residual is None else (out, residual)


def rope_inv_freq(rotary_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies for rotary embedding, with optional "linear" or "llama3" scaling."""
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
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
    raise ValueError(f"rope type {rope_type!r} is not supported; supported: default, linear, llama3")


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (HF Llama/Qwen ``rotate_half``), looked up by absolute position."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        self.head_dim, self.max_position = head_dim, max_position
        self.theta, self.scaling = theta, scaling
        self.register_buffer("cos_sin", self._cos_sin(), persistent=False)

    def _cos_sin(self, device: torch.device | None = None) -> torch.Tensor:
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(device)
        freqs = torch.outer(torch.arange(self.max_position, dtype=torch.float32, device=device), inv_freq)
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [max_position, head_dim]

    def init_buffers(self, device: torch.device) -> None:
        """Recompute the table after the module was materialized from the meta device."""
        self.cos_sin = self._cos_sin(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos and sin for each token, [T, 1, head_dim / 2] each; looked up once, used by every layer."""
        cos, sin = self.cos_sin[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
        return cos, sin


def apply_rotary(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate [T, H, D] by each token's angle; same math as HF's ``x * cos + rotate_half(x) * sin``."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class MLP(nn.Module):
    """SiLU-gated MLP with gate and up projections fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Attention(nn.Module):
    """q/k/v in one fused projection, optional per-head q/k RMSNorm (Qwen3), rotary, paged attention."""

    def __init__(self, arch: ArchConfig, backend: AttentionBackend, qk_norm: bool) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = arch.num_attention_heads, arch.num_key_value_heads
        self.head_dim = arch.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(arch.hidden_size, self.q_size + 2 * self.kv_size, bias=arch.attention_bias)
        self.o_proj = nn.Linear(self.q_size, arch.hidden_size, bias=arch.attention_out_bias)
        self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps) if qk_norm else None
        self.backend = backend

    def forward(
        self, rope: Rope, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out)


class DecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend, qk_norm: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = Attention(arch, backend, qk_norm)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = MLP(arch.hidden_size, arch.intermediate_size)

    def forward(
        self,
        rope: Rope,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend, qk_norm: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(arch, backend, qk_norm) for _ in range(arch.num_hidden_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(
            arch.head_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        rope = self.rotary_emb(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(rope, x, residual, kv_cache, meta)
        x, _ = self.norm(x, residual)
        return x


# HF checkpoint name piece -> (our fused parameter's piece, which shard of it)
_FUSED = {
    ".q_proj.": (".qkv_proj.", "q"),
    ".k_proj.": (".qkv_proj.", "k"),
    ".v_proj.": (".qkv_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", "gate"),
    ".up_proj.": (".gate_up_proj.", "up"),
}


def _shards(param_name: str) -> list[str]:
    """Checkpoint pieces that fill a parameter: its fused shards, or the whole ("")."""
    return [shard for fused_piece, shard in _FUSED.values() if fused_piece in param_name] or [""]


class CausalLM(nn.Module):
    """Decoder + LM head (tied to the embedding when the architecture says so).

    Subclasses name an architecture and set its options, e.g. ``qk_norm = True`` for Qwen3.
    """

    qk_norm: bool = False

    def __init__(self, arch: ArchConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.arch = arch
        self.model = DecoderModel(arch, backend, self.qk_norm)
        # A tied head reads the embedding weight: a second Parameter would come untied in to_empty().
        self.lm_head = (
            None if arch.tie_word_embeddings else nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Run one ragged step batch; returns final hidden states [T, hidden]."""
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32 logits."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into our (partly fused) parameters; ValueError on missing or unknown."""
        params = dict(self.named_parameters())
        loaded: set[tuple[str, str]] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.lm_head is None):
                continue
            target, shard = name, ""
            for piece, (fused_piece, fused_shard) in _FUSED.items():
                if piece in name:
                    target, shard = name.replace(piece, fused_piece), fused_shard
                    break
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {type(self).__name__}")
            dest = self._shard_of(params[target].data, target, shard)
            if dest.shape != tensor.shape:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            loaded.add((target, shard))
        missing = sorted({(n, s) for n in params for s in _shards(n)} - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")

    def _shard_of(self, data: torch.Tensor, target: str, shard: str) -> torch.Tensor:
        if shard in ("gate", "up"):
            return data.chunk(2, dim=0)[shard == "up"]
        if shard in ("q", "k", "v"):
            attn = self.get_submodule(target.rsplit(".qkv_proj.", 1)[0])
            start = {"q": 0, "k": attn.q_size, "v": attn.q_size + attn.kv_size}[shard]
            return data.narrow(0, start, attn.q_size if shard == "q" else attn.kv_size)
        return data
