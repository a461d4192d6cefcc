"""Architecture name (HF ``architectures[0]``) -> model class, filled by ``@register_model``.

Each model file registers itself; ``MODEL_FILES`` lists the files to import, so adding an
architecture is one new file plus its name here.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from folovllm.registry import Registry

if TYPE_CHECKING:
    from folovllm.model.layers import CausalLM

MODEL_FILES = ("llama", "qwen2", "qwen3", "gemma3")  # modules of folovllm.model
MODEL_REGISTRY: Registry[type[CausalLM]] = Registry("model architecture")
register_model = MODEL_REGISTRY.register  # class decorator: the model class for an HF architecture name


def _registry() -> Registry[type[CausalLM]]:
    for name in MODEL_FILES:  # importing a model file runs its @register_model
        importlib.import_module(f"folovllm.model.{name}")
    return MODEL_REGISTRY


def get_model_class(architecture: str) -> type[CausalLM]:
    """The model class for an architecture name (``XForSequenceClassification``: ``XForCausalLM`` with a
    score head); ValueError listing what is supported otherwise."""
    registry = _registry()
    causal = architecture.removesuffix("ForSequenceClassification") + "ForCausalLM"
    if architecture.endswith("ForSequenceClassification") and causal in registry.names():
        from folovllm.model.layers.score_head import sequence_classifier

        return sequence_classifier(registry.get(causal))
    if architecture not in registry.names():
        raise ValueError(
            f"model architecture {architecture!r} is not supported; supported: {sorted(registry.names())}"
        )
    return registry.get(architecture)


def architecture_for_gguf(gguf_architecture: str, name: str = "") -> str:
    """The HF architecture name of a GGUF ``general.architecture`` (e.g. "llama" -> "LlamaForCausalLM")."""
    registry = _registry()
    by_gguf = {registry.get(arch).gguf_architecture: arch for arch in registry.names()
               if registry.get(arch).gguf_architecture}
    if gguf_architecture not in by_gguf:
        raise ValueError(
            f"GGUF architecture {gguf_architecture!r} in {name!r} is not supported; supported: {sorted(by_gguf)}"
        )
    return by_gguf[gguf_architecture]
