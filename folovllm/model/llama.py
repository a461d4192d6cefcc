"""Llama (and SmolLM2, Mistral-style dense) decoder: the shared layers with no extras."""
from folovllm.model.layers import CausalLM


class LlamaForCausalLM(CausalLM):
    qk_norm = False
