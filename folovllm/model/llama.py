"""Llama (also SmolLM2 and Mistral-style dense models): pre-norm decoder, GQA, SiLU-gated MLP.

Quirks held here: q/k/v and o biases follow the checkpoint (``attention_bias``), the head may be
tied to the embedding, and llama.cpp's converter permutes q/k rows in GGUF files. Architectures that
are this block with other attention details (Qwen2, Qwen3) subclass it and override the class
attributes below; a different block gets a file of its own, written like this one.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import SLIDING, ArchConfig
from folovllm.model.direct import DirectDecoderLayer, direct_calls_enabled, direct_layer, hook_tables
from folovllm.model.layer_chain import LayerChain, layer_chain
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


class LlamaDecoderLayer(nn.Module):
    qk_norm = False  # a per-head RMSNorm on q and k before rotary

    @staticmethod
    def attention_biases(arch: ArchConfig) -> tuple[bool, bool]:
        """(bias on q/k/v, bias on o_proj): Llama follows the checkpoint's config."""
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


class LlamaModel(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig,
                 decoder_layer: type[LlamaDecoderLayer] = LlamaDecoderLayer) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(arch.vocab_size, arch.hidden_size, weights)
        self.layers = nn.ModuleList(
            decoder_layer(arch, backend, weights) for _ in range(arch.num_hidden_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, weights)
        self.rotary_emb = RotaryEmbedding(
            arch.head_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling, weights.device
        )
        self.direct_layers: list[DirectDecoderLayer] | None = None  # set by use_direct_calls, after loading
        self.hook_tables: list[dict] = []  # any hook in these sends a step through the modules
        self.layer_chain: LayerChain | None = None  # the direct layers as one C++ call, for decode steps

    def use_direct_calls(self, enabled: bool) -> None:
        """Run the decoder layers as direct op calls (``model/direct.py``) when every layer has that form;
        reads the weights as they are now, so call it once they are loaded and processed."""
        direct = [direct_layer(layer, LlamaDecoderLayer.forward) for layer in self.layers] if enabled else []
        self.direct_layers = direct if direct and all(d is not None for d in direct) else None
        self.hook_tables = hook_tables(self.modules()) if self.direct_layers is not None else []
        self.layer_chain = layer_chain(self.direct_layers) if self.direct_layers is not None else None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache], meta: AttentionMetadata
    ) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        rope = self.rotary_emb(positions, x.dtype)
        direct = self.direct_layers is not None and x.is_contiguous() and not any(self.hook_tables)
        if direct and self.layer_chain is not None and self.layer_chain.runs(meta):
            x, residual = self.layer_chain(rope, x, kv_caches, meta)
        else:
            layers: Sequence[Callable] = self.direct_layers if direct else self.layers
            for layer, kv_cache in zip(layers, kv_caches, strict=True):
                x, residual = layer(rope, x, residual, kv_cache, meta)
        x, _ = self.norm(x, residual)
        return x


@register_model("LlamaForCausalLM")
class LlamaForCausalLM(CausalLM):
    decoder_layer: type[LlamaDecoderLayer] = LlamaDecoderLayer
    gguf_architecture = "llama"
    gguf_qk_permuted = True

    def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
        if SLIDING in arch.layer_types:  # this block attends over the whole context in every layer
            raise ValueError(f"{arch.name!r} ({arch.architecture}) has sliding-window layers, which this model "
                             "file does not implement")
        super().__init__(arch, weights)
        self.model = LlamaModel(arch, backend, weights, self.decoder_layer)
        self.lm_head = lm_head(arch, weights)

    def process_weights_after_loading(self) -> None:
        super().process_weights_after_loading()
        self.model.use_direct_calls(direct_calls_enabled())
