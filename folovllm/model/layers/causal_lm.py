"""What every model class offers the engine: forward, logits, checkpoint loading, weight bytes."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import ArchConfig
from folovllm.model.layers.attention import KVCache
from folovllm.model.layers.embedding import LMHead
from folovllm.model.layers.linear import ShardId, WeightConfig, kv_heads_per_rank
from folovllm.model.layers.weights import load_checkpoint, process_weights_after_loading, weight_bytes


class CausalLM(nn.Module):
    """A model file subclasses it, builds ``self.model`` (with ``embed_tokens``) and ``self.lm_head``,
    and states its checkpoint facts in the class attributes below."""

    # checkpoint name piece -> (our parameter piece, shard id): the merged QKV and gate/up projections
    # that Attention and GatedMLP hold; a model whose checkpoint splits otherwise overrides it
    stacked_params: dict[str, tuple[str, ShardId]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    # llama.cpp's name for the architecture in GGUF metadata, if it reads GGUF files
    gguf_architecture: str | None = None
    # llama.cpp's converter permuted the q/k rows of this architecture; the GGUF reader undoes it
    gguf_qk_permuted: bool = False
    # GGUF block tensor names that mean another HF name in this architecture (e.g. "ffn_norm")
    gguf_block_tensors: dict[str, str] = {}
    # llama.cpp stores RMSNorm weights plus this offset; the GGUF reader subtracts it
    gguf_norm_offset: float = 0.0
    # ArchConfig fields llama.cpp fixes for this architecture instead of writing them into the file
    # (and "sliding_window_pattern": every n-th layer global)
    gguf_defaults: dict[str, Any] = {}

    model: nn.Module
    lm_head: LMHead

    def __init__(self, arch: ArchConfig, weights: WeightConfig) -> None:
        super().__init__()
        self.arch = arch
        self.dtype = weights.dtype  # activations and KV cache
        self.tp_size, self.tp_group = weights.tp_size, weights.tp_group
        self.num_kv_heads = kv_heads_per_rank(arch.num_key_value_heads, weights.tp_size)  # this rank's KV cache

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Run one ragged step batch; returns final hidden states [T, hidden]."""
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[N, hidden] -> [N, vocab] float32 logits; under tensor parallelism only rank 0 gets them
        (each rank computes its vocab slice; the slices are gathered to rank 0, the others get None)."""
        local = self.lm_head(hidden)
        if self.tp_size == 1:
            return local.float()
        if self.tp_group is None:
            raise RuntimeError(f"logits with tp_size={self.tp_size} need a gather: build the model with a tp_group")
        gathered = self.tp_group.gather_to_first(local.float())  # fp32 on the wire: the sampler reads fp32
        return None if gathered is None else gathered[:, :self.arch.vocab_size]

    def greedy_head(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """hidden [N, hidden] -> each row's greedy token [N], the argmax of ``compute_logits`` without the
        logits, where the head's method offers it; None for a model that adjusts its logits (its own
        ``compute_logits``, e.g. soft-capping) or a head split over ranks."""
        if type(self).compute_logits is not CausalLM.compute_logits:
            return None
        return self.lm_head.greedy_argmax()

    def skips_checkpoint_tensor(self, name: str) -> bool:
        """Checkpoint tensors with no parameter here: HF's rotary cache, a head tied to the embedding."""
        return "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.lm_head.tied is not None)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the parameters; ValueError on unknown, mis-shaped or missing ones."""
        load_checkpoint(self, weights)

    def process_weights_after_loading(self) -> None:
        """Once every checkpoint tensor is in: each linear's method (the head's too) repacks or quantizes."""
        process_weights_after_loading(self)
        self.lm_head.finish_tie()

    def weight_bytes(self) -> int:
        """Bytes held by parameters and buffers (a tied weight once)."""
        return weight_bytes(self)
