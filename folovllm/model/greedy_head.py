"""Greedy decoding's shortcut through the LM head on CPU: each row's next token straight from the
hidden states, without the [rows, vocab] logits.

A step whose rows are all plain greedy (no logits processor, no logprobs) only needs each row's
argmax. The kernel (csrc/cpu_greedy_head.cpp: ``torch.ops.folovllm_cpu_head``) multiplies the hidden
states by the head packed for the bf16 linear kernel and keeps only each row's best token, so the
logits are never written, converted to fp32 or read again by a separate argmax. Its logits are those
of the bf16 linear kernel bit for bit, and ties go to the first token as ``torch.argmax``'s do, so
the tokens equal the sampler's argmax of ``compute_logits`` (the engine's ``cpu_greedy_head`` switch).

An int8 LM head (``quant/lm_head.py``) has its own: ``int8_argmax`` (csrc/cpu_quant_gemm.cpp) runs the
head's int8 matmul and takes each row's argmax in the same call, so the step's tokens come back without
the logits going through the sampler; the same logits, so the same tokens. For bf16 hidden states it keeps
each row's best logit inside the matmul's loop, the logits never written (``FOLOVLLM_INT8_FUSED_ARGMAX``,
on by default; off: the matmul's logits, then torch's argmax).
"""
from __future__ import annotations

import torch

from folovllm.config import env_switch
from folovllm.kernel_libraries import CPU_GREEDY_HEAD_LIBRARY, cpu_greedy_head_available
from folovllm.model.cpu_packed import PackedLinearMethod
from folovllm.model.layers import CausalLM
from folovllm.model.quant.kernels import Int8ChannelKernel


INT8_FUSED_ARGMAX_ENV = "FOLOVLLM_INT8_FUSED_ARGMAX"


class GreedyHead:
    """Callable: hidden [N, hidden] (bf16) -> each row's greedy token id [N] (int64): ``op(hidden, *head)``
    (``head``: the packed head's tensors, and the op's options after them)."""

    def __init__(self, op, *head: torch.Tensor | bool) -> None:
        self.op, self.head = op, head

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.op(hidden, *self.head)


def int8_greedy_head(kernel: Int8ChannelKernel, vocab_size: int) -> GreedyHead | None:
    """``int8_argmax`` on an int8 head held for our int8 kernel, or None (torch's kernel, the reference path,
    per-channel offsets, a padded vocabulary)."""
    if not kernel.ours or kernel.reference or kernel.offsets is not None or kernel.scales.numel() != vocab_size:
        return None
    return GreedyHead(torch.ops.folovllm_cpu_quant.int8_argmax.default, kernel.codes, kernel.scales,
                      env_switch(INT8_FUSED_ARGMAX_ENV))


def greedy_head_for(model: torch.nn.Module) -> GreedyHead | None:
    """The shortcut for ``model``'s LM head, or None where it would not equal ``compute_logits``'s argmax:
    a model that adjusts its logits (its own ``compute_logits``, e.g. soft-capping), tensor parallelism, or a
    head neither packed for the bf16 linear kernel nor int8 for ours (oneDNN, plain), or the kernel's library
    not loading here."""
    if not isinstance(model, CausalLM) or type(model).compute_logits is not CausalLM.compute_logits:
        return None
    if model.tp_size != 1:
        return None
    head = model.model.embed_tokens if model.lm_head is None else model.lm_head
    int8 = head.int8_head if model.lm_head is None else getattr(head, "quant_kernel", None)
    if isinstance(int8, Int8ChannelKernel):
        return int8_greedy_head(int8, model.arch.vocab_size)
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
    return GreedyHead(torch.ops.folovllm_cpu_head.argmax,
                      packed.data if isinstance(packed, torch.nn.Parameter) else packed)
