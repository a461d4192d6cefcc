"""Qwen2 (and Qwen2.5): the Llama block with a bias on q/k/v and none on o_proj, whatever the config says.

The head may be tied to the embedding; llama.cpp stores Qwen2 q/k rows unpermuted in GGUF files.
"""
from __future__ import annotations

from folovllm.model.arch import ArchConfig
from folovllm.model.llama import LlamaDecoderLayer, LlamaForCausalLM
from folovllm.model.registry import register_model


class Qwen2DecoderLayer(LlamaDecoderLayer):
    @staticmethod
    def attention_biases(arch: ArchConfig) -> tuple[bool, bool]:
        return True, False  # released Qwen2 checkpoints carry q/k/v biases but leave them out of config.json


@register_model("Qwen2ForCausalLM")
class Qwen2ForCausalLM(LlamaForCausalLM):
    decoder_layer = Qwen2DecoderLayer
    gguf_architecture = "qwen2"
    gguf_qk_permuted = False
