"""A ``*ForSequenceClassification`` checkpoint: the causal LM's decoder with a one-output score head.

The class is made from the architecture's ``*ForCausalLM`` class: the same decoder and checkpoint
names, plus ``score`` ([num_labels, hidden], no bias). Nothing is generated, so the LM head takes the
embedding's table (no memory, nothing to load). ``classify`` turns pooled hidden states (the last
token's, as transformers pools) into each text's score: the head's logit through a sigmoid.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.model.arch import ArchConfig
from folovllm.model.layers.causal_lm import CausalLM
from folovllm.model.layers.linear import WeightConfig

SEQUENCE_CLASSIFICATION = "ForSequenceClassification"


@functools.cache
def sequence_classifier(base: type[CausalLM]) -> type[CausalLM]:
    """``base`` with a score head instead of a used LM head (one class per base)."""

    class SequenceClassifier(base):  # type: ignore[misc, valid-type]
        def __init__(self, arch: ArchConfig, backend: AttentionBackend, weights: WeightConfig) -> None:
            if arch.num_labels not in (None, 1):
                raise ValueError(f"{arch.architecture} with num_labels={arch.num_labels}: only a one-label score "
                                 "head (a cross-encoder's relevance score) is implemented")
            super().__init__(arch, backend, weights)
            if self.lm_head.tied is None:
                self.lm_head.tie(self.model.embed_tokens)
            self.score = nn.Linear(arch.hidden_size, 1, bias=False, dtype=weights.dtype, device=weights.device)

        def classify(self, pooled: torch.Tensor) -> torch.Tensor:
            """[N, hidden] pooled hidden states -> [N, 1] scores in (0, 1), float32."""
            return torch.sigmoid(self.score(pooled.to(self.score.weight.dtype)).float())

    SequenceClassifier.__name__ = SequenceClassifier.__qualname__ = base.__name__.replace("ForCausalLM",
                                                                                        SEQUENCE_CLASSIFICATION)
    return SequenceClassifier
