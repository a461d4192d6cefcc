"""An engine config's KV transfer settings, and the connector they name, for either side."""
from __future__ import annotations

import os
import socket
import uuid

from folovllm.config import EngineConfig
from folovllm.kv_transfer.base import ConnectorSide, KVConnectorBase, KVTransferSettings, make_kv_connector

DEFAULT_KV_CONNECTOR = "torch_distributed"
DEFAULT_LOAD_COPY_MB_PER_STEP = 2.0  # torch_distributed: see KVTransferSettings
_ROLES = {"producer": "kv_producer", "consumer": "kv_consumer", "both": "kv_both"}


def kv_transfer_settings(config: EngineConfig) -> KVTransferSettings:
    """The settings every connector reads; ``config.kv_role`` must be set."""
    if config.kv_role is None:
        raise ValueError("KV transfer needs a kv_role (producer, consumer or both)")
    extra = dict(config.kv_transfer_config or {})
    more = extra.get("kv_connector_extra_config") or {}
    if not isinstance(more, dict):
        raise ValueError("kv_transfer_config's kv_connector_extra_config must be a JSON object")
    engine_id = str(extra.get("engine_id") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    port = extra.get("kv_port", 0)
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"kv_transfer_config's kv_port must be a port number (0: a free one); got {port!r}")
    copy_mb = more.get("load_copy_mb_per_step", DEFAULT_LOAD_COPY_MB_PER_STEP)
    if isinstance(copy_mb, bool) or not isinstance(copy_mb, (int, float)) or copy_mb < 0:
        raise ValueError("kv_transfer_config's kv_connector_extra_config.load_copy_mb_per_step must be a "
                         f"number of MB >= 0 (0: copy each arrival whole); got {copy_mb!r}")
    return KVTransferSettings(role=_ROLES[config.kv_role], engine_id=engine_id, block_size=config.block_size,
                              timeout_s=config.kv_transfer_timeout,
                              storage_path=str(more.get("shared_storage_path", "")),
                              host=str(extra.get("kv_ip", "127.0.0.1")), port=port,
                              load_copy_bytes_per_step=int(copy_mb * 2**20))


def connector_name(config: EngineConfig) -> str:
    return config.kv_connector or DEFAULT_KV_CONNECTOR


def make_connector(config: EngineConfig, side: ConnectorSide,
                   settings: KVTransferSettings | None = None) -> KVConnectorBase | None:
    """The config's connector for ``side``, or None when the engine has no KV role."""
    if config.kv_role is None:
        return None
    return make_kv_connector(connector_name(config), settings or kv_transfer_settings(config), side)
