"""The engine configuration's checks that span several fields: runner and convert, LoRA, KV transfer
(PD disaggregation), and nodes for tensor parallelism across machines. Each raises a ValueError that says
what to change; run from ``EngineConfig.__post_init__``."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from folovllm.config import EngineConfig

KV_ROLES = ("producer", "consumer", "both")
_VLLM_KV_ROLES = {"kv_producer": "producer", "kv_consumer": "consumer", "kv_both": "both"}
KV_TRANSFER_CONFIG_KEYS = ("kv_connector", "kv_role", "kv_ip", "kv_port", "engine_id", "kv_connector_extra_config")
RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed")


def check_runner(config: EngineConfig) -> None:
    """--runner and --convert agree (pooling a checkpoint means converting it; generating means not)."""
    if config.runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}; got {config.runner!r}")
    if config.convert not in CONVERTS:
        raise ValueError(f"convert must be one of {', '.join(CONVERTS)}; got {config.convert!r}")
    if config.runner == "generate" and config.convert == "embed":
        raise ValueError("convert='embed' makes a pooling model: use runner='pooling' (or 'auto')")
    if config.runner == "pooling" and config.convert == "none":
        raise ValueError("runner='pooling' needs a pooling model; every architecture here is generative, "
                         "so pass convert='embed' (or 'auto')")
    if config.pooler_config is not None and config.runner != "pooling" and config.convert != "embed":
        raise ValueError("pooler_config applies to a pooling model only: add runner='pooling'")


def check_lora(config: EngineConfig) -> None:
    if config.max_loras < 1 or config.max_lora_rank < 1:
        raise ValueError(f"max_loras and max_lora_rank must be >= 1; got {config.max_loras}, {config.max_lora_rank}")
    if config.max_cpu_loras is not None and config.max_cpu_loras < config.max_loras:
        raise ValueError(f"max_cpu_loras={config.max_cpu_loras} must be >= max_loras={config.max_loras}")
    if config.enable_lora and config.tensor_parallel_size > 1:
        raise ValueError("enable_lora runs with tensor_parallel_size=1 only; adapters are not split "
                         "across ranks")


def check_kv_transfer(config: EngineConfig) -> None:
    """--kv-transfer-config's kv_role and kv_connector become --kv-role and --kv-connector (the
    two must agree when both are given)."""
    given = config.kv_transfer_config
    if given is not None:
        if not isinstance(given, dict):
            raise ValueError(f"kv_transfer_config must be a dict (JSON object); got {type(given).__name__}")
        unknown = sorted(set(given) - set(KV_TRANSFER_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"kv_transfer_config keys {unknown} are not implemented; "
                             f"use {', '.join(KV_TRANSFER_CONFIG_KEYS)}")
        for key, name in (("kv_role", "kv_role"), ("kv_connector", "kv_connector")):
            value = given.get(key)
            if key == "kv_role" and value is not None:
                if value not in _VLLM_KV_ROLES:
                    raise ValueError(f"kv_transfer_config kv_role must be one of {list(_VLLM_KV_ROLES)}; "
                                     f"got {value!r}")
                value = _VLLM_KV_ROLES[value]
            if value is None:
                continue
            if getattr(config, name) not in (None, value):
                raise ValueError(f"--{name.replace('_', '-')}={getattr(config, name)!r} disagrees with "
                                 f"kv_transfer_config's {key}={given[key]!r}; give one")
            object.__setattr__(config, name, value)
    if config.kv_role is not None and config.kv_role not in KV_ROLES:
        raise ValueError(f"kv_role must be one of {', '.join(KV_ROLES)}; got {config.kv_role!r}")
    if config.kv_role is None and config.kv_connector is not None:
        raise ValueError(f"kv_connector={config.kv_connector!r} needs a kv_role (producer, consumer or both)")
    if config.kv_role is not None and (config.tensor_parallel_size > 1 or config.data_parallel_size > 1):
        raise ValueError("PD disaggregation (kv_role) works with tensor_parallel_size=1 and "
                         "data_parallel_size=1 only: run more producers or consumers behind the proxy")
    if config.kv_transfer_timeout <= 0:
        raise ValueError(f"kv_transfer_timeout must be > 0 seconds; got {config.kv_transfer_timeout}")


def check_nodes(config: EngineConfig) -> None:
    """Tensor parallelism across machines: the ranks split evenly, and every node can find node 0."""
    if config.nnodes < 1:
        raise ValueError(f"nnodes must be >= 1; got {config.nnodes}")
    if not 0 <= config.node_rank < config.nnodes:
        raise ValueError(f"node_rank={config.node_rank} must lie in [0, nnodes={config.nnodes}); "
                         "node 0 runs the engine, nodes 1..nnodes-1 only their ranks")
    if config.tensor_parallel_size % config.nnodes:
        raise ValueError(f"tensor_parallel_size={config.tensor_parallel_size} does not split evenly over "
                         f"nnodes={config.nnodes}: give a multiple of {config.nnodes} (the ranks per node are "
                         "tensor_parallel_size / nnodes)")
    if config.master_port is not None and not 0 <= config.master_port <= 65535:
        raise ValueError(f"master_port must be a TCP port in [0, 65535]; got {config.master_port}")
    if config.nnodes > 1 and (not config.master_addr or not config.master_port):
        raise ValueError(f"nnodes={config.nnodes} needs --master-addr and --master-port (node 0's address "
                         "and a port every node can reach, the same on every node); got "
                         f"master_addr={config.master_addr!r}, master_port={config.master_port!r}")
