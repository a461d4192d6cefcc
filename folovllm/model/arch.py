"""ArchConfig: the architecture facts the model code needs, whatever file format they came from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# HF config fields that change the math and that our model code does not implement.
_UNSUPPORTED_FLAGS = ("mlp_bias", "use_sliding_window", "attn_logit_softcapping", "use_bidirectional_attention")
SLIDING, FULL = "sliding_attention", "full_attention"  # HF's layer_types entries
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
    rope_scaling: dict[str, Any] | None = None  # None, or {"rope_type": "linear" | "llama3" | "freq_factors", ...}
    # Sliding-window layers (Gemma 3): layer i is SLIDING or FULL (empty: every layer FULL); a SLIDING
    # layer's query sees its last ``sliding_window`` positions, itself included, with its own rope.
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None
    rope_local_theta: float | None = None  # SLIDING layers' rope base; None: rope_theta
    rope_local_scaling: dict[str, Any] | None = None  # SLIDING layers' rope scaling
    hidden_act: str = "silu"  # the gated MLP's activation
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power; None: head_dim's
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # the checkpoint has q/k/v biases (a model file may fix its own rule)
    attention_out_bias: bool = False  # the checkpoint has an o_proj bias
    quantization: str = "unquantized"  # names the LinearMethod that holds the linear weights
    quantization_config: dict[str, Any] = field(default_factory=dict)  # the checkpoint's settings for it
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""
    num_labels: int | None = None  # a *ForSequenceClassification checkpoint's score head outputs

    def __post_init__(self) -> None:
        if self.hidden_size <= 0 or self.num_attention_heads <= 0 or self.num_hidden_layers <= 0:
            raise ValueError(f"ArchConfig {self.name!r}: sizes must be positive")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"ArchConfig {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.layer_types:
            if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {SLIDING, FULL}:
                raise ValueError(f"ArchConfig {self.name!r}: layer_types must list {SLIDING!r} or {FULL!r} for "
                                 f"each of the {self.num_hidden_layers} layers; got {self.layer_types}")
            if SLIDING in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
                raise ValueError(f"ArchConfig {self.name!r}: sliding layers need a positive sliding_window; "
                                 f"got {self.sliding_window}")

    def layer_sliding_window(self, layer: int) -> int | None:
        """The window of layer ``layer`` (positions a query sees, itself included), None if it sees all."""
        return self.sliding_window if self.layer_types and self.layer_types[layer] == SLIDING else None

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
        rope_local_theta = rope_local_scaling = None
        if FULL in rope_params or SLIDING in rope_params:  # transformers 5: one rope per layer type
            rope_theta, rope_scaling = _rope(rope_params.get(FULL) or {}, config.get("rope_theta", 10000.0))
            rope_local_theta, rope_local_scaling = _rope(
                rope_params.get(SLIDING) or {}, config.get("rope_local_base_freq", rope_theta))
        else:
            rope_theta, rope_scaling = _rope(rope_params, config.get("rope_theta", 10000.0))
            if config.get("rope_local_base_freq") is not None:  # transformers 4 Gemma 3: scaling is global only
                rope_local_theta = float(config["rope_local_base_freq"])
        layer_types = list(config.get("layer_types") or [])
        # older configs name a pattern (every n-th layer global); Gemma 3's default is 6
        pattern = config.get("sliding_window_pattern") or (6 if config.get("model_type") == "gemma3_text" else 0)
        if not layer_types and pattern:
            pattern = int(pattern)
            layer_types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(config["num_hidden_layers"])]

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
            layer_types=layer_types,
            sliding_window=config.get("sliding_window") if SLIDING in layer_types else None,
            rope_local_theta=rope_local_theta,
            rope_local_scaling=rope_local_scaling,
            hidden_act=config.get("hidden_activation") or config.get("hidden_act") or "silu",
            query_pre_attn_scalar=config.get("query_pre_attn_scalar"),
            final_logit_softcapping=config.get("final_logit_softcapping"),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            attention_out_bias=attention_bias,
            quantization=quantization,
            quantization_config=quantization_config,
            eos_token_ids=eos_ids,
            name=name or config.get("_name_or_path", ""),
            num_labels=len(config["id2label"]) if config.get("id2label") else config.get("num_labels"),
        )


def _rope(params: dict[str, Any], default_theta: float) -> tuple[float, dict[str, Any] | None]:
    """(rope base, scaling dict or None) from one HF rope-parameters dict."""
    params = dict(params)
    theta = float(params.pop("rope_theta", default_theta))
    rope_type = params.get("rope_type", params.get("type", "default"))
    return theta, None if rope_type == "default" else {**params, "rope_type": rope_type}
