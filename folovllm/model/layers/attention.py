"""Paged self-attention: merged q/k/v projection, optional q/k norms, rotary, the backend, o_proj."""
from __future__ import annotations

import torch
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import ArchConfig
from folovllm.model.layers.custom_op import CustomOp
from folovllm.model.layers.linear import QKVParallelLinear, RowParallelLinear, WeightConfig
from folovllm.model.layers.norm import RMSNorm
from folovllm.model.layers.rotary import Rope, apply_rotary

KVCache = tuple[torch.Tensor, torch.Tensor]


class Attention(CustomOp):
    """Paged self-attention: merged q/k/v projection, optional per-head q/k RMSNorm, rotary, o_proj.

    Which biases and norms exist is the model file's choice (``qkv_bias``, ``o_bias``, ``qk_norm``,
    ``norm_class``), and so are the score scale (default head_dim^-1/2) and the layer's sliding window.
    Kernel form (q/k norms, if any, plain RMSNorms): the q/k norms, rotary and the K/V store as one op.
    """

    def __init__(
        self,
        arch: ArchConfig,
        backend: AttentionBackend,
        weights: WeightConfig,
        *,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
        norm_class: type[nn.Module] = RMSNorm,
        scale: float | None = None,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            arch.hidden_size, arch.head_dim, arch.num_attention_heads, arch.num_key_value_heads, qkv_bias, weights
        )
        # this rank's heads (all of them without tensor parallelism)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = arch.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5 if scale is None else scale
        self.eps = arch.rms_norm_eps  # of the q/k norms
        self.sliding_window = sliding_window
        self.o_proj = RowParallelLinear(
            arch.num_attention_heads * arch.head_dim, arch.hidden_size, o_bias, weights
        )
        self.q_norm = norm_class(self.head_dim, arch.rms_norm_eps, weights) if qk_norm else None
        self.k_norm = norm_class(self.head_dim, arch.rms_norm_eps, weights) if qk_norm else None
        self.backend = backend

    def takes_kernel_form(self) -> bool:
        return self.q_norm is None or type(self.q_norm) is RMSNorm

    def forward_native(
        self, rope: Rope, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.sliding_window)
        return self.o_proj(out)

    def forward_kernel(
        self, rope: Rope, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        q_norm, k_norm = self.q_norm, self.k_norm
        q, k, v = self.ops.rotary_store_kv(
            self.qkv_proj(x), self.num_heads, self.num_kv_heads, rope[0], rope[1],
            None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
            self.eps, kv_cache[0], kv_cache[1], meta.slot_mapping)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.sliding_window,
                                   kv_stored=True)
        return self.o_proj(out)
