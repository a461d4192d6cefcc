"""The shared pieces model files compose: norms, rotary, attention, the MLP, the vocabulary's two ends,
linear layers, the pre-norm decoder block, and the ``CausalLM`` base."""
from folovllm.model.layers.attention import Attention, KVCache
from folovllm.model.layers.causal_lm import CausalLM
from folovllm.model.layers.custom_op import CustomOp
from folovllm.model.layers.decoder import DecoderLayers, PreNormDecoderLayer
from folovllm.model.layers.embedding import LMHead, VocabEmbedding, lm_head, vocab_shard
from folovllm.model.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    WeightConfig,
)
from folovllm.model.layers.mlp import GatedMLP
from folovllm.model.layers.norm import RMSNorm
from folovllm.model.layers.rotary import Rope, RotaryEmbedding, apply_rotary, rope_inv_freq

__all__ = [
    "Attention", "CausalLM", "ColumnParallelLinear", "CustomOp", "DecoderLayers", "GatedMLP", "KVCache", "LMHead",
    "LinearBase", "MergedColumnParallelLinear", "PreNormDecoderLayer", "QKVParallelLinear", "RMSNorm",
    "ReplicatedLinear", "Rope", "RotaryEmbedding", "RowParallelLinear", "VocabEmbedding", "WeightConfig",
    "apply_rotary", "lm_head", "rope_inv_freq", "vocab_shard",
]
