"""Greedy decoding's shortcut through the LM head on CPU: each row's next token straight from the
hidden states, without the [rows, vocab] logits.

A step whose rows are all plain greedy (no logits processor, no logprobs) only needs each row's
argmax. The kernel (csrc/cpu_greedy_head.cpp: ``torch.ops.folovllm_cpu_head``) multiplies the hidden
states by the head packed for the bf16 linear kernel and keeps only each row's best token, so the
logits are never written, converted to fp32 or read again by a separate argmax. Its logits are those
of the bf16 linear kernel bit for bit, and ties go to the first token as ``torch.argmax``'s do, so
the tokens equal the sampler's argmax of ``compute_logits`` (the engine's ``cpu_greedy_head`` switch).
"""
from __future__ import annotations

import torch

from folovllm.config import CPU_GREEDY_HEAD_LIBRARY, cpu_greedy_head_available
from folovllm.model.cpu_packed import PackedLinearMethod
from folovllm.model.layers import CausalLM


class GreedyHead:
    """Callable: hidden [N, hidden] (bf16) -> each row's greedy token id [N] (int64)."""

    def __init__(self, packed_head: torch.Tensor) -> None:
        self.packed_head = packed_head

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.ops.folovllm_cpu_head.argmax(hidden, self.packed_head)


def greedy_head_for(model: torch.nn.Module) -> GreedyHead | None:
    """The shortcut for ``model``'s LM head, or None where it would not equal ``compute_logits``'s argmax:
    a model that adjusts its logits (its own ``compute_logits``, e.g. soft-capping), tensor parallelism, or a
    head not packed for the bf16 linear kernel (oneDNN, plain, int8), or the kernel's library not loading here."""
    if not isinstance(model, CausalLM) or type(model).compute_logits is not CausalLM.compute_logits:
        return None
    if model.tp_size != 1:
        return None
    if model.lm_head is None:
        packed = model.model.embed_tokens.packed_head
    elif isinstance(model.lm_head.method, PackedLinearMethod):
        packed = model.lm_head.weight
    else:
        return None
    if (packed is None or packed.is_mkldnn or packed.dim() != 4 or packed.dtype != torch.bfloat16
            or packed.shape[0] * packed.shape[2] != model.arch.vocab_size):
        return None
    if not cpu_greedy_head_available(CPU_GREEDY_HEAD_LIBRARY):
        return None
    return GreedyHead(packed.data if isinstance(packed, torch.nn.Parameter) else packed)
