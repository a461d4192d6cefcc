"""Qwen2 (and Qwen2.5): the Llama block with a bias on q/k/v and none on o_proj, whatever the config says.

The head may be tied to the embedding; llama.cpp stores Qwen2 q/k rows unpermuted in GGUF files.
"""
from __future__ import annotations

import torch
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import ArchConfig
from folovllm.model.layers import (
    Attention,
    CausalLM,
    GatedMLP,
    KVCache,
    RMSNorm,
    Rope,
    RotaryEmbedding,
    VocabEmbedding,
    lm_head,
)
from folovllm.model.linear import WeightConfig
from folovllm.model.registry import register_model


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, weights)
        self.self_attn = Attention(
            arch, backend, weights, qkv_bias=True, o_bias=False, qk_norm=False
        )
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, weights)
        self.mlp = GatedMLP(arch.hidden_size, arch.intermediate_size, weights)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None, kv_cache: KVCache, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Qwen2Model(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(arch.vocab_size, arch.hidden_size, weights)
        self.layers = nn.ModuleList(
            Qwen2DecoderLayer(arch, backend, weights) for _ in range(arch.num_hidden_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, weights)
        self.rotary_emb = RotaryEmbedding(
            arch.head_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling, weights.device
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache], meta: AttentionMetadata
    ) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        rope = self.rotary_emb(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(rope, x, residual, kv_cache, meta)
        x, _ = self.norm(x, residual)
        return x


@register_model("Qwen2ForCausalLM")
class Qwen2ForCausalLM(CausalLM):
    stacked_params = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    gguf_architecture = "qwen2"

    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
        super().__init__(arch, weights)
        self.model = Qwen2Model(arch, backend, weights)
        self.lm_head = lm_head(arch, weights)
