"""Shared decoder pieces (norm, rotary, attention, MLP, embedding, LM base); model files compose them."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from folovllm.attention.backend import AttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.arch import ArchConfig
from folovllm.model.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    ShardId,
    WeightConfig,
    all_reduce,
    kv_heads_per_rank,
)
from folovllm.model.cpu_packed import PackedLinearMethod, pack_linear_weight, packed_linear
from folovllm.model.linear_method import LinearMethod, UnquantizedLinearMethod
from folovllm.model.quant.kernels import Int8ChannelKernel
from folovllm.model.quant.lm_head import Int8HeadMethod, int8_head_kernel, int8_rows
from folovllm.model.weights import load_checkpoint, process_weights_after_loading, weight_bytes

KVCache = tuple[torch.Tensor, torch.Tensor]
Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, -sin | sin) per token, full head width


def fused_ops() -> Any:
    """The fused CPU ops' namespace (``torch.ops.folovllm_cpu_fused``); its library is loaded by then."""
    return torch.ops.folovllm_cpu_fused


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 like HF; with ``residual`` it first adds it (fused-add variant).

    With ``weights.cpu_fused_ops`` one C++ call does both (the sum written into ``residual`` in place).
    """

    def __init__(self, hidden_size: int, eps: float, weights: WeightConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.ones(hidden_size, dtype=weights.dtype, device=weights.device), requires_grad=False
        )
        self.eps = eps
        self.fused = fused_ops() if weights.cpu_fused_ops else None

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.fused is not None and x.is_contiguous():  # q/k norms get strided heads: the torch path
            if residual is None:
                return self.fused.rms_norm(x, self.weight, self.eps)
            return self.fused.add_rms_norm(residual, x, self.weight, self.eps), residual
        if residual is not None:
            x = x + residual
            residual = x
        # One fused kernel in fp32, then HF's order: cast back, then scale by the weight.
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        out = h.to(x.dtype).mul_(self.weight)  # h is this call's own tensor: scale it in place
        return out if residual is None else (out, residual)


def rope_inv_freq(rotary_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies for rotary embedding, with optional "linear" or "llama3" scaling."""
    # on the CPU in float64 whatever the target device, so every device gets the same table
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq.float()
    if rope_type == "linear":
        return (inv_freq / scaling["factor"]).float()
    if rope_type == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled).float()
    raise ValueError(f"rope type {rope_type!r} is not supported; supported: default, linear, llama3")


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (HF Llama/Qwen ``rotate_half``), looked up by absolute position."""

    def __init__(
        self, head_dim: int, max_position: int, theta: float, scaling: dict | None, device: torch.device
    ) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32, device=device), inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        # full-width cos and sign-folded sin: rotary is then two multiplies and an add per tensor
        self.register_buffer("cos_sin", torch.cat([cos, cos, -sin, sin], dim=-1), persistent=False)
        # dtype -> (the buffer it was made from, the table in that dtype as [positions, 1, 2 * head_dim]): a
        # step's lookup is then one gather, with the values of gathering then casting; not a buffer itself,
        # it is remade when the buffer is replaced (``Module.to``)
        self._cos_sin_as: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos and signed sin (-sin | sin) per token, [T, 1, head_dim] each; looked up once per step."""
        source, table = self._cos_sin_as.get(dtype, (None, None))
        if source is not self.cos_sin:
            source = self.cos_sin
            table = source.to(dtype).unsqueeze(1)
            self._cos_sin_as[dtype] = source, table
        cos, signed_sin = table[positions].chunk(2, dim=-1)
        return cos, signed_sin


def apply_rotary(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate [T, H, D] by each token's angle: HF's ``x * cos + rotate_half(x) * sin``, bit for bit.

    ``rotate_half(x) * sin`` is computed as ``[x2, x1] * [-sin, sin]``: negating a factor is exact,
    so each half is rounded exactly as ``x1 * cos - x2 * sin`` and ``x2 * cos + x1 * sin`` are.
    """
    cos, signed_sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([x2, x1], dim=-1) * signed_sin


def vocab_shard(vocab_size: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """(first token id, rows) of a rank's slice of the vocabulary: ceil(vocab / tp_size) rows each,
    the last rank's tail padded with zero rows (their logits are cut off after the gather)."""
    rows = -(-vocab_size // tp_size)
    return tp_rank * rows, rows


def load_vocab_rows(param: nn.Parameter, loaded: torch.Tensor, first: int, vocab_size: int) -> None:
    """Copy rows [first, first + rows) of a [vocab, hidden] checkpoint tensor; rows past the vocab are 0."""
    if loaded.shape != (vocab_size, *param.shape[1:]):
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {(vocab_size, *param.shape[1:])}")
    end = min(first + param.shape[0], vocab_size)
    param.data.zero_()
    param.data[:end - first].copy_(loaded[first:end])


class VocabEmbedding(nn.Module):
    """Token id -> hidden vector; its table is also the LM head when embeddings are tied.

    Vocab-parallel: each rank holds a slice of the rows (``vocab_shard``), looks up the ids that fall
    in it (zeros for the others) and the ranks' vectors are summed.
    """

    packed_head: torch.Tensor | None
    int8_head: Int8ChannelKernel | None

    def __init__(self, vocab_size: int, hidden_size: int, weights: WeightConfig) -> None:
        super().__init__()
        self.vocab_size, self.dtype = vocab_size, weights.dtype
        self.tp_size, self.tp_group = weights.tp_size, weights.tp_group
        self.first, self.rows = vocab_shard(vocab_size, weights.tp_rank, weights.tp_size)
        self.weight = nn.Parameter(
            torch.empty(self.rows, hidden_size, dtype=weights.dtype, device=weights.device), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader
        self.register_buffer("packed_head", None, persistent=False)
        self.int8_head = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """This rank's rows of the checkpoint's [vocab, hidden] table."""
        load_vocab_rows(param, loaded, self.first, self.vocab_size)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.int8_head is not None:
            return int8_rows(self.int8_head, ids, self.dtype)
        return F.embedding(ids, self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._lookup(input_ids)
        local = input_ids - self.first
        outside = (local < 0) | (local >= self.rows)
        x = self._lookup(local.masked_fill(outside, 0))
        x.masked_fill_(outside.unsqueeze(-1), 0)
        return all_reduce(x, self.tp_group, self.tp_size, "a vocab-parallel embedding")

    def pack_head(self, bf16_kernel: bool = False) -> None:
        """Keep a prepacked copy of the table for the tied logits matmul (the lookup needs the plain one);
        ``bf16_kernel``: packed for FoloVLLM's bf16 kernel where it fits (``cpu_packed.py``)."""
        self.packed_head = pack_linear_weight(self.weight, bf16_kernel)

    def quantize_head(self) -> None:
        """Hold the table as int8 rows only: the logits matmul reads them, the lookup dequantizes them."""
        self.int8_head = int8_head_kernel(self.weight.data, self.dtype)
        del self.weight  # the int8 copy replaces it (weight bytes)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] @ table^T: the tied LM head (this rank's vocab slice), in the model dtype."""
        if self.int8_head is not None:
            return self.int8_head(hidden)
        if self.packed_head is not None:
            return packed_linear(hidden, self.packed_head, None)
        return F.linear(hidden, self.weight)


class ParallelLMHead(LinearBase):
    """The untied output projection, split by vocabulary rows like ``VocabEmbedding``."""

    def __init__(self, hidden_size: int, vocab_size: int, weights: WeightConfig, method: LinearMethod) -> None:
        self.vocab_size = vocab_size
        self.first, rows = vocab_shard(vocab_size, weights.tp_rank, weights.tp_size)
        super().__init__(hidden_size, rows, False, weights, method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        load_vocab_rows(param, loaded, self.first, self.vocab_size)


# HF activation names the gated MLP implements -> the function applied to the gate
_ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class GatedMLP(nn.Module):
    """Gated MLP (SiLU by default) with gate and up projections merged into one matmul (shards 0 and 1)."""

    def __init__(self, hidden_size: int, intermediate_size: int, weights: WeightConfig,
                 activation: str = "silu") -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"MLP activation {activation!r} is not supported; supported: {sorted(_ACTIVATIONS)}")
        self.act = _ACTIVATIONS[activation]
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=False, weights=weights
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, weights=weights)
        self.silu_and_mul = fused_ops().silu_and_mul if weights.cpu_fused_ops and activation == "silu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.silu_and_mul is not None:
            return self.down_proj(self.silu_and_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate).mul_(up))


class Attention(nn.Module):
    """Paged self-attention: merged q/k/v projection, optional per-head q/k RMSNorm, rotary, o_proj.

    Which biases and norms exist is the model file's choice (``qkv_bias``, ``o_bias``, ``qk_norm``,
    ``norm_class``), and so are the score scale (default head_dim^-1/2) and the layer's sliding window.
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
        # one C++ call for q/k norms (plain RMSNorm only), rotary and the K/V store
        fuse = weights.cpu_fused_ops and (not qk_norm or norm_class is RMSNorm)
        self.rotary_store_kv = fused_ops().rotary_store_kv if fuse else None

    def forward(
        self, rope: Rope, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        if self.rotary_store_kv is not None:
            q_norm, k_norm = self.q_norm, self.k_norm
            q, k, v = self.rotary_store_kv(
                self.qkv_proj(x), self.num_heads, self.num_kv_heads, rope[0], rope[1],
                None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
                self.eps, kv_cache[0], kv_cache[1], meta.slot_mapping)
            out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.sliding_window,
                                       kv_stored=True)
            return self.o_proj(out)
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.sliding_window)
        return self.o_proj(out)


def lm_head(arch: ArchConfig, weights: WeightConfig) -> ParallelLMHead | None:
    """The output projection, or None when tied to the embedding (then ``compute_logits`` reads that).

    Whatever the linear method, it is int8 with ``weights.quantize_lm_head`` (``quant/lm_head.py``),
    else an unquantized weight in the model dtype, prepacked when ``weights.cpu_prepack``.
    """
    if arch.tie_word_embeddings:
        return None
    if weights.quantize_lm_head:
        method: LinearMethod = Int8HeadMethod()
    else:
        method = PackedLinearMethod(weights.cpu_bf16_linear) if weights.cpu_prepack else UnquantizedLinearMethod()
    return ParallelLMHead(arch.hidden_size, arch.vocab_size, weights, method)


class CausalLM(nn.Module):
    """What every model class offers the engine: forward, logits, checkpoint loading, weight bytes.

    A model file subclasses it, builds ``self.model`` (with ``embed_tokens``) and ``self.lm_head``,
    and states its checkpoint facts in the class attributes below.
    """

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
    lm_head: ParallelLMHead | None

    def __init__(self, arch: ArchConfig, weights: WeightConfig) -> None:
        super().__init__()
        self.arch = arch
        self.dtype = weights.dtype  # activations and KV cache
        self.cpu_prepack = weights.cpu_prepack
        self.cpu_bf16_linear = weights.cpu_bf16_linear
        self.quantize_lm_head = weights.quantize_lm_head
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
        local = self.model.embed_tokens.logits(hidden) if self.lm_head is None else self.lm_head(hidden)
        if self.tp_size == 1:
            return local.float()
        if self.tp_group is None:
            raise RuntimeError(f"logits with tp_size={self.tp_size} need a gather: build the model with a tp_group")
        gathered = self.tp_group.gather_to_first(local.float())  # fp32 on the wire: the sampler reads fp32
        return None if gathered is None else gathered[:, :self.arch.vocab_size]

    def skips_checkpoint_tensor(self, name: str) -> bool:
        """Checkpoint tensors with no parameter here: HF's rotary cache, a head tied to the embedding."""
        return "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.lm_head is None)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the parameters; ValueError on unknown, mis-shaped or missing ones."""
        load_checkpoint(self, weights)

    def process_weights_after_loading(self) -> None:
        """Once every checkpoint tensor is in: each linear's method repacks or quantizes; a tied head is
        quantized (``quantize_lm_head``) or packed."""
        process_weights_after_loading(self)
        if self.lm_head is None and self.quantize_lm_head:
            self.model.embed_tokens.quantize_head()
        elif self.cpu_prepack and self.lm_head is None:
            self.model.embed_tokens.pack_head(self.cpu_bf16_linear)

    def weight_bytes(self) -> int:
        """Bytes held by parameters and buffers (a tied weight once)."""
        return weight_bytes(self)
