"""Architecture name (HF ``architectures[0]``) -> model class."""
from __future__ import annotations

from folovllm.model.layers import CausalLM
from folovllm.model.llama import LlamaForCausalLM
from folovllm.model.qwen2 import Qwen2ForCausalLM
from folovllm.model.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def get_model_class(architecture: str) -> type[CausalLM]:
    """The model class for an architecture name; ValueError listing what is supported otherwise."""
    if architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"model architecture {architecture!r} is not supported; supported: {sorted(MODEL_REGISTRY)}"
        )
    return MODEL_REGISTRY[architecture]
