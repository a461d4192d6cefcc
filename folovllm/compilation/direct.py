"""Decoder layers run as direct op calls, without ``nn.Module.__call__`` on the hot path.

A batch-1 decode step of a small model is ~30 layers x ~13 module calls, each a few microseconds of
hook checks and attribute lookups around a kernel that itself takes tens of microseconds. A
``DirectDecoderLayer`` holds, once, what a Llama-style layer's forward reads (norm weights, the
linears' bound matmuls, the fused ops) and calls the ops in the same order with the same arguments,
so its outputs are bit-identical to the modules'.

It only stands in for layers that are exactly the shared pre-norm block in its kernel forms
(``direct_layer`` returns None otherwise), and the model falls back to the module calls whenever a
hook is registered on any of its modules (GPTQ calibration measures inputs with forward pre-hooks).
``FOLOVLLM_CPU_DECODER=modules`` always calls the modules. Decode steps on the CPU attention kernel go one
step further: ``layer_chain.py`` makes these layers' op calls from C++, one call per step.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.layers import Attention, GatedMLP, KVCache, PreNormDecoderLayer, RMSNorm, Rope
from folovllm.model.quantization.cpu_int4 import fused_int4_mlp


def hook_tables(modules: Iterable[nn.Module]) -> list[dict]:
    """The dicts that hold the forward hooks a call of any of ``modules`` would run (the global ones too):
    hooks are added to and removed from these in place, so ``any(tables)`` tells, in one C loop, whether
    one is registered now."""
    tables = [torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks]
    for m in modules:
        tables += (m._forward_hooks, m._forward_pre_hooks)
    return tables


class DirectDecoderLayer:
    """``PreNormDecoderLayer.forward`` as a plain function of what the layer holds (see the module doc)."""

    def __init__(self, layer: PreNormDecoderLayer) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        ops = attn.ops  # the platform's op table, which direct_layer found on every part
        self.rms_norm, self.add_rms_norm = ops.rms_norm, ops.add_rms_norm
        self.rotary_store_kv, self.silu_and_mul = ops.rotary_store_kv, ops.silu_and_mul
        self.norm1, self.norm2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.eps1, self.eps2 = layer.input_layernorm.eps, layer.post_attention_layernorm.eps
        self.qkv, self.o_proj = attn.qkv_proj.bound(), attn.o_proj.bound()
        self.gate_up, self.down = mlp.gate_up_proj.bound(), mlp.down_proj.bound()
        fusable = mlp.gate_up_proj.method.fusable and mlp.down_proj.method.fusable
        # the three MLP ops as one call, or None
        self.mlp = fused_int4_mlp(mlp.gate_up_proj, mlp.down_proj) if fusable else None
        self.num_heads, self.num_kv_heads, self.qk_eps = attn.num_heads, attn.num_kv_heads, attn.eps
        self.q_norm = None if attn.q_norm is None else attn.q_norm.weight
        self.k_norm = None if attn.k_norm is None else attn.k_norm.weight
        self.attention, self.scale, self.sliding_window = attn.backend.forward, attn.scale, attn.sliding_window
        self.backend = attn.backend

    def __call__(self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None, kv_cache: KVCache,
                 meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, residual = self.rms_norm(x, self.norm1, self.eps1), x
        else:
            x = self.add_rms_norm(residual, x, self.norm1, self.eps1)
        k_cache, v_cache = kv_cache
        q, k, v = self.rotary_store_kv(self.qkv(x), self.num_heads, self.num_kv_heads, rope[0], rope[1],
                                       self.q_norm, self.k_norm, self.qk_eps, k_cache, v_cache, meta.slot_mapping)
        out = self.attention(q, k, v, k_cache, v_cache, meta, self.scale, self.sliding_window, kv_stored=True)
        x = self.add_rms_norm(residual, self.o_proj(out), self.norm2, self.eps2)
        if self.mlp is not None:
            return self.mlp(x), residual
        return self.down(self.silu_and_mul(self.gate_up(x))), residual


def direct_layer(layer: nn.Module) -> DirectDecoderLayer | None:
    """The direct form of a pre-norm decoder layer whose pieces are the shared ones in their kernel forms;
    None for any other layer."""
    if not isinstance(layer, PreNormDecoderLayer) or type(layer).forward is not PreNormDecoderLayer.forward:
        return None
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if not all(type(n) is RMSNorm and n.kernel_form for n in norms):
        return None
    attn, mlp = layer.self_attn, layer.mlp
    if type(attn) is not Attention or not attn.kernel_form:
        return None
    if attn.q_norm is not None and type(attn.q_norm) is not RMSNorm:
        return None
    if type(mlp) is not GatedMLP or not mlp.kernel_form:
        return None
    return DirectDecoderLayer(layer)
