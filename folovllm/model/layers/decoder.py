"""The pre-norm decoder block (Llama, Qwen2, Qwen3, Mistral) and a model's stack of decoder layers.

``DecoderLayers`` is the seam where a platform's faster form of the same layers plugs in: a compile step
(``folovllm/compilation``) may set ``compiled``, which is tried first on each step and returns None for a
step it does not take; the modules then run it. The model files only call ``run``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import ArchConfig
from folovllm.model.layers.attention import Attention, KVCache
from folovllm.model.layers.linear import WeightConfig
from folovllm.model.layers.mlp import GatedMLP
from folovllm.model.layers.norm import RMSNorm
from folovllm.model.layers.rotary import Rope

# rope, embeddings, the layers' KV caches, the step's metadata -> (x, residual) after the last layer, or None
CompiledLayers = Callable[[Rope, torch.Tensor, list[KVCache], AttentionMetadata],
                          tuple[torch.Tensor, torch.Tensor] | None]


class PreNormDecoderLayer(nn.Module):
    """RMSNorm -> attention -> add & RMSNorm -> gated MLP, the residual stream carried beside.

    Subclasses state their attention's details: ``qk_norm`` and ``attention_biases``."""

    qk_norm = False  # a per-head RMSNorm on q and k before rotary

    @staticmethod
    def attention_biases(arch: ArchConfig) -> tuple[bool, bool]:
        """(bias on q/k/v, bias on o_proj): as the checkpoint's config says."""
        return arch.attention_bias, arch.attention_out_bias

    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, weights)
        qkv_bias, o_bias = self.attention_biases(arch)
        self.self_attn = Attention(arch, backend, weights, qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=self.qk_norm)
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


class DecoderLayers(nn.ModuleList):
    """A model's pre-norm decoder layers, run in order over one step (see the module doc)."""

    compiled: CompiledLayers | None = None

    def run(self, rope: Rope, x: torch.Tensor, kv_caches: list[KVCache],
            meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) after every layer, from the embeddings ``x``."""
        if self.compiled is not None:
            out = self.compiled(rope, x, kv_caches, meta)
            if out is not None:
                return out
        residual = None
        for layer, kv_cache in zip(self, kv_caches, strict=True):
            x, residual = layer(rope, x, residual, kv_cache, meta)
        return x, residual
