"""ArchConfig: the architecture facts the model code needs, whatever file format they came from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# HF config fields that change the math and that our model code does not implement.
_UNSUPPORTED_FLAGS = ("mlp_bias", "use_sliding_window")
_REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass
class ArchConfig:
    """Shape and numerics of one decoder-only transformer (Llama family)."""

    architecture: str  # HF class name, e.g. "LlamaForCausalLM"; picks the model class
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # None, or {"rope_type": "linear" | "llama3", ...}
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # the checkpoint has q/k/v biases (a model file may fix its own rule)
    attention_out_bias: bool = False  # the checkpoint has an o_proj bias
    quantization: str = "unquantized"  # names the LinearMethod that holds the linear weights
    quantization_config: dict[str, Any] = field(default_factory=dict)  # the checkpoint's settings for it
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        if self.hidden_size <= 0 or self.num_attention_heads <= 0 or self.num_hidden_layers <= 0:
            raise ValueError(f"ArchConfig {self.name!r}: sizes must be positive")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"ArchConfig {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "") -> "ArchConfig":
        """Build from a HF ``config.json`` dict (transformers 4 ``rope_theta`` or 5 ``rope_parameters``)."""
        architectures = config.get("architectures") or []
        if not architectures:
            raise ValueError(f"config {name!r} has no 'architectures' entry; cannot pick a model class")
        architecture = architectures[0]
        missing = [k for k in _REQUIRED_KEYS if not config.get(k)]
        if missing:
            raise ValueError(f"config {name!r} lacks required fields {missing}")
        for flag in _UNSUPPORTED_FLAGS:
            if config.get(flag):
                raise ValueError(f"config {name!r}: '{flag}: true' is not supported")

        rope_params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        rope_theta = float(rope_params.pop("rope_theta", config.get("rope_theta", 10000.0)))
        rope_type = rope_params.get("rope_type", rope_params.get("type", "default"))
        rope_scaling = None if rope_type == "default" else {**rope_params, "rope_type": rope_type}

        num_heads = config["num_attention_heads"]
        eos = config.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        attention_bias = bool(config.get("attention_bias", False))  # HF: one flag for q/k/v and o
        quantization_config = dict(config.get("quantization_config") or {})
        quantization = quantization_config.get("quant_method", "unquantized")
        return cls(
            architecture=architecture,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            attention_out_bias=attention_bias,
            quantization=quantization,
            quantization_config=quantization_config,
            eos_token_ids=eos_ids,
            name=name or config.get("_name_or_path", ""),
        )
