"""A GPU cost model from first principles: a step's FLOPs and bytes (from the model's config) against
a device's published peaks, each scaled by a stated efficiency, plus a fixed per-step host overhead
and, under tensor parallelism, two all-reduces per layer.

    step = overhead + max(FLOPs / (peak_flops · compute_eff), bytes / (HBM bandwidth · bandwidth_eff))
           + 2 · layers · (link_latency + ring all-reduce bytes / link bandwidth)     (TP > 1)

Dense bf16 peaks: H100 SXM 989 TFLOP/s and 3.35 TB/s; H200 989 TFLOP/s and 4.8 TB/s.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from folovllm.simulator.cost_model import StepShape


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory_bytes: float
    link_bandwidth: float  # bytes/s per direction between GPUs (NVLink), for TP all-reduce and PD transfer


DEVICES = {
    "h100": DeviceSpec("H100 SXM", 989e12, 3.35e12, 80e9, 450e9),
    "h200": DeviceSpec("H200", 989e12, 4.8e12, 141e9, 450e9),
}


@dataclass(frozen=True)
class ModelShape:
    """The parts of a decoder-only model's config that set its FLOPs, bytes and KV size."""

    name: str
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = True
    dtype_bytes: int = 2  # bf16 weights and KV

    @property
    def layer_params(self) -> int:
        """Matmul weights of one decoder layer: q, k, v, o and the gated MLP (norms are negligible)."""
        h, q, kv = self.hidden_size, self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size

    def flops(self, num_tokens: int, num_sampled: int, attention_pairs: int) -> float:
        """Matmul FLOPs of ``num_tokens`` tokens through every layer, ``num_sampled`` rows of logits and
        ``attention_pairs`` (query, key) pairs of attention (QK^T and PV, every query head)."""
        dense = 2.0 * self.layer_params * self.num_layers * num_tokens
        head = 2.0 * self.hidden_size * self.vocab_size * num_sampled
        attention = 4.0 * self.num_layers * self.num_q_heads * self.head_dim * attention_pairs
        return dense + head + attention

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        return self.layer_params * self.num_layers + embed * (1 if self.tied_embeddings else 2)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


QWEN3_0_6B = ModelShape("Qwen3-0.6B", hidden_size=1024, num_layers=28, num_q_heads=16, num_kv_heads=8,
                        head_dim=128, intermediate_size=3072, vocab_size=151936, tied_embeddings=True)
KNOWN_MODELS = {"qwen3-0.6b": QWEN3_0_6B}


def load_model_shape(spec: str) -> ModelShape:
    """A known name (``Qwen3-0.6B``), or an HF ``config.json`` (or the folder holding it)."""
    if spec.lower() in KNOWN_MODELS:
        return KNOWN_MODELS[spec.lower()]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"--model-config {spec!r}: not a known model ({', '.join(KNOWN_MODELS)}) "
                         "nor a config.json or a folder holding one")
    cfg = json.loads(path.read_text())
    try:
        heads = cfg["num_attention_heads"]
        return ModelShape(cfg.get("_name_or_path") or path.parent.name, cfg["hidden_size"], cfg["num_hidden_layers"],
                          heads, cfg.get("num_key_value_heads", heads),
                          cfg.get("head_dim") or cfg["hidden_size"] // heads, cfg["intermediate_size"],
                          cfg["vocab_size"], bool(cfg.get("tie_word_embeddings", False)))
    except KeyError as err:
        raise ValueError(f"{path} lacks {err.args[0]!r}, which the roofline needs") from None


@dataclass
class RooflineCostModel:
    """Step time of ``model`` on ``tp`` GPUs of ``device`` (see the module docstring)."""

    model: ModelShape
    device: DeviceSpec
    tp: int = 1
    compute_efficiency: float = 0.5  # share of peak FLOP/s dense matmuls reach
    bandwidth_efficiency: float = 0.7  # share of peak HBM bandwidth streaming reads reach
    overhead_s: float = 0.002  # per step: scheduling, input preparation, kernel launches
    link_latency_s: float = 10e-6  # per all-reduce

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tensor parallel size must be >= 1, got {self.tp}")
        for name in ("compute_efficiency", "bandwidth_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        self.name = f"roofline:{self.device.name}:{self.model.name}:tp{self.tp}"

    def flops(self, shape: StepShape) -> float:
        return self.model.flops(shape.num_tokens, shape.num_sampled, shape.attention_pairs)

    def bytes(self, shape: StepShape) -> float:
        m = self.model
        weights = (m.layer_params * m.num_layers + m.vocab_size * m.hidden_size) * m.dtype_bytes
        kv = (shape.context_tokens + shape.num_tokens) * m.kv_bytes_per_token  # read the cache, write the new
        return float(weights + kv)

    def all_reduce_time(self, num_tokens: int) -> float:
        """Two ring all-reduces per layer of the step's hidden states."""
        if self.tp == 1:
            return 0.0
        size = num_tokens * self.model.hidden_size * self.model.dtype_bytes
        one = self.link_latency_s + 2.0 * (self.tp - 1) / self.tp * size / self.device.link_bandwidth
        return 2 * self.model.num_layers * one

    def step_time(self, shape: StepShape) -> float:
        compute = self.flops(shape) / (self.device.peak_flops * self.compute_efficiency * self.tp)
        memory = self.bytes(shape) / (self.device.hbm_bandwidth * self.bandwidth_efficiency * self.tp)
        return self.overhead_s + max(compute, memory) + self.all_reduce_time(shape.num_tokens)

    def num_kv_blocks(self, block_size: int, memory_utilization: float = 0.9) -> int:
        """Blocks that fit the memory share left after the weights (activations taken as 5 % of memory)."""
        free = self.device.memory_bytes * (memory_utilization - 0.05) * self.tp - self.model.weight_bytes
        if free <= 0:
            raise ValueError(f"{self.model.name} does not fit {self.tp} x {self.device.name}")
        return int(free // (self.model.kv_bytes_per_token * block_size))
