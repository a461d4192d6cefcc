"""Llama (also SmolLM2 and Mistral-style dense models): pre-norm decoder, GQA, SiLU-gated MLP.

Quirks held here: q/k/v and o biases follow the checkpoint (``attention_bias``), the head may be
tied to the embedding, and llama.cpp's converter permutes q/k rows in GGUF files. Architectures that
are this block with other attention details (Qwen2, Qwen3) subclass it and override the class
attributes below; a different block gets a file of its own, written like this one.
"""
from __future__ import annotations

import torch
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import SLIDING, ArchConfig
from folovllm.model.layers import (
    CausalLM,
    DecoderLayers,
    KVCache,
    PreNormDecoderLayer,
    RMSNorm,
    RotaryEmbedding,
    VocabEmbedding,
    WeightConfig,
    lm_head,
)
from folovllm.model.registry import register_model


class LlamaDecoderLayer(PreNormDecoderLayer):
    """The pre-norm block as Llama's config states it (biases as ``attention_bias`` says, no q/k norm)."""


class LlamaModel(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig,
                 decoder_layer: type[PreNormDecoderLayer] = LlamaDecoderLayer) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(arch.vocab_size, arch.hidden_size, weights)
        self.layers = DecoderLayers(decoder_layer(arch, backend, weights) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, weights)
        self.rotary_emb = RotaryEmbedding(
            arch.head_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling, weights.device
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache], meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb(positions, x.dtype)
        x, residual = self.layers.run(rope, x, kv_caches, meta)
        x, _ = self.norm(x, residual)
        return x


@register_model("LlamaForCausalLM")
class LlamaForCausalLM(CausalLM):
    decoder_layer: type[PreNormDecoderLayer] = LlamaDecoderLayer
    gguf_architecture = "llama"
    gguf_qk_permuted = True

    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
        if SLIDING in arch.layer_types:  # this block attends over the whole context in every layer
            raise ValueError(f"{arch.name!r} ({arch.architecture}) has sliding-window layers, which this model "
                             "file does not implement")
        super().__init__(arch, weights)
        self.model = LlamaModel(arch, backend, weights, self.decoder_layer)
        self.lm_head = lm_head(arch, weights, self.model.embed_tokens)
