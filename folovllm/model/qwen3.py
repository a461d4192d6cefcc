"""Qwen3 decoder: Llama layout plus a per-head RMSNorm on q and k before rotary."""
from folovllm.model.layers import CausalLM


class Qwen3ForCausalLM(CausalLM):
    qk_norm = True
