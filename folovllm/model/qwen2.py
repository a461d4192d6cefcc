"""Qwen2 decoder: Llama layout with q/k/v biases (ArchConfig.attention_bias is set for it)."""
from folovllm.model.layers import CausalLM


class Qwen2ForCausalLM(CausalLM):
    qk_norm = False
