"""Gemma 3 (text): sliding-window and global attention layers, four norms per block, GELU-gated MLP.

Quirks held here: the embedding is scaled by sqrt(hidden_size) in the model dtype; every RMSNorm
scales by (1 + weight) in fp32 (llama.cpp stores 1 + weight in GGUF files, so its loader subtracts
1); q and k get a per-head norm; scores are scaled by query_pre_attn_scalar^-1/2; each layer is a
sliding-window layer (its own window and rope base) or a global one; the head is tied to the embedding
and its logits may be soft-capped.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import SLIDING, ArchConfig
from folovllm.model.layers import (
    Attention,
    CausalLM,
    GatedMLP,
    KVCache,
    Rope,
    RotaryEmbedding,
    VocabEmbedding,
    WeightConfig,
    lm_head,
)
from folovllm.model.registry import register_model


class GemmaRMSNorm(nn.Module):
    """RMSNorm that scales by (1 + weight), all in fp32, then casts back (the weight is zero-centred)."""

    def __init__(self, hidden_size: int, eps: float, weights: WeightConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.zeros(hidden_size, dtype=weights.dtype, device=weights.device), requires_grad=False
        )
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3DecoderLayer(nn.Module):
    """Norms around both sub-blocks (pre and post), each sub-block added to the residual stream."""

    def __init__(self, arch: ArchConfig, layer: int, backend: AttentionBackend, weights: WeightConfig) -> None:
        super().__init__()
        self.is_sliding = arch.layer_sliding_window(layer) is not None
        scalar = arch.query_pre_attn_scalar or arch.head_dim
        self.self_attn = Attention(
            arch, backend, weights, qkv_bias=arch.attention_bias, o_bias=arch.attention_out_bias, qk_norm=True,
            norm_class=GemmaRMSNorm, scale=scalar**-0.5, sliding_window=arch.layer_sliding_window(layer),
        )
        self.mlp = GatedMLP(arch.hidden_size, arch.intermediate_size, weights, arch.hidden_act)
        norm = lambda: GemmaRMSNorm(arch.hidden_size, arch.rms_norm_eps, weights)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    def forward(self, rope: Rope, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        h = self.self_attn(rope, self.input_layernorm(x), kv_cache, meta)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class Gemma3Model(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(arch.vocab_size, arch.hidden_size, weights)
        # the scale is rounded to the model dtype before it multiplies (sqrt(640) differs in bf16)
        self.register_buffer("embed_scale", torch.tensor(arch.hidden_size**0.5).to(weights.device, weights.dtype), persistent=False)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(arch, i, backend, weights) for i in range(arch.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(arch.hidden_size, arch.rms_norm_eps, weights)
        self.rotary_emb = RotaryEmbedding(
            arch.head_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling, weights.device
        )
        self.local_rotary_emb = None
        if SLIDING in arch.layer_types:
            local_theta = arch.rope_theta if arch.rope_local_theta is None else arch.rope_local_theta
            self.local_rotary_emb = RotaryEmbedding(
                arch.head_dim, arch.max_position_embeddings, local_theta, arch.rope_local_scaling, weights.device
            )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache], meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids) * self.embed_scale
        rope = self.rotary_emb(positions, x.dtype)
        local_rope = rope if self.local_rotary_emb is None else self.local_rotary_emb(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(local_rope if layer.is_sliding else rope, x, kv_cache, meta)
        return self.norm(x)


@register_model("Gemma3ForCausalLM")
class Gemma3ForCausalLM(CausalLM):
    gguf_architecture = "gemma3"
    gguf_block_tensors = {
        "attn_norm": "input_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }
    gguf_norm_offset = 1.0
    # what llama.cpp fixes for this architecture rather than writing into the file's metadata
    gguf_defaults = {"sliding_window_pattern": 6, "rope_local_theta": 10000.0, "hidden_act": "gelu_pytorch_tanh"}

    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
        super().__init__(arch, weights)
        self.model = Gemma3Model(arch, backend, weights)
        self.lm_head = lm_head(arch, weights, self.model.embed_tokens)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.arch.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
