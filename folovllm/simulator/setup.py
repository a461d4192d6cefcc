"""Everything one simulated deployment needs, resolved from the options once: the engine settings,
the cost model, the KV cache size and the cluster's shape."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from folovllm.config import EngineConfig
from folovllm.simulator.cluster import ClusterSpec
from folovllm.simulator.cost_model import PROFILES_DIR, CostModel, builtin_profiles, load_linear_profile
from folovllm.simulator.roofline import DEVICES, RooflineCostModel, load_model_shape

DEFAULT_MAX_MODEL_LEN = 8192  # roofline profiles: the model's own maximum is rarely what is deployed


@dataclass(frozen=True)
class SimSetup:
    config: EngineConfig
    cost: CostModel
    num_blocks: int  # per replica
    max_model_len: int
    cluster: ClusterSpec
    model: str  # the name results carry


@dataclass(frozen=True)
class RooflineOptions:
    model_config: str | None = None
    tp: int = 1
    compute_efficiency: float = 0.5
    bandwidth_efficiency: float = 0.7
    overhead_s: float = 0.002
    memory_utilization: float = 0.9


def resolve_cost(profile: str, config: EngineConfig, roofline: RooflineOptions,
                 num_blocks: int | None) -> tuple[CostModel, int, int, int, str]:
    """(cost model, KV blocks per replica, max_model_len, KV bytes per token or 0, model name) for
    ``profile``: ``roofline:DEVICE``, a shipped profile's name, or a profile JSON file."""
    kind, _, device = profile.partition(":")
    if kind == "roofline":
        if device not in DEVICES:
            raise ValueError(f"--profile roofline:DEVICE takes one of {', '.join(DEVICES)}; got {device!r}")
        if roofline.model_config is None:
            raise ValueError("a roofline profile needs --model-config (a config.json, its folder, or Qwen3-0.6B)")
        model = load_model_shape(roofline.model_config)
        cost = RooflineCostModel(model, DEVICES[device], roofline.tp, roofline.compute_efficiency,
                                 roofline.bandwidth_efficiency, roofline.overhead_s)
        max_len = config.max_model_len or DEFAULT_MAX_MODEL_LEN
        blocks = num_blocks or cost.num_kv_blocks(config.block_size, roofline.memory_utilization)
        return cost, blocks, max_len, model.kv_bytes_per_token, model.name
    path = Path(profile) if Path(profile).suffix == ".json" else PROFILES_DIR / f"{profile}.json"
    if not path.is_file():
        raise ValueError(f"--profile {profile!r}: no such file; give roofline:DEVICE, a profile JSON, "
                         f"or one of {', '.join(builtin_profiles())}")
    linear = load_linear_profile(path)
    defaults: dict[str, Any] = linear.defaults
    if roofline.tp != 1:
        raise ValueError("--tensor-parallel-size applies to roofline profiles; a fitted profile already "
                         "measured its own parallelism")
    max_len = config.max_model_len or int(defaults.get("max_model_len", DEFAULT_MAX_MODEL_LEN))
    blocks = num_blocks or int(defaults.get("num_kv_blocks", 0))
    if blocks < 1:
        raise ValueError(f"{path} records no KV cache size; pass --num-kv-blocks")
    return linear, blocks, max_len, int(defaults.get("kv_bytes_per_token", 0)), str(defaults.get("model", linear.name))
