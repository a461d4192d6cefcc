"""Qwen3 (dense): the Llama block plus a per-head RMSNorm on q and k before rotary.

Biases follow the checkpoint (``attention_bias``, off in released models); the head may be tied to
the embedding; llama.cpp stores Qwen3 q/k rows unpermuted in GGUF files.
"""
from __future__ import annotations

from folovllm.model.llama import LlamaDecoderLayer, LlamaForCausalLM
from folovllm.model.registry import register_model


class Qwen3DecoderLayer(LlamaDecoderLayer):
    qk_norm = True


@register_model("Qwen3ForCausalLM")
class Qwen3ForCausalLM(LlamaForCausalLM):
    decoder_layer = Qwen3DecoderLayer
    gguf_architecture = "qwen3"
    gguf_qk_permuted = False
