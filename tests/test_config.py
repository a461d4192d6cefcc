"""EngineConfig: frozen, validated on construction, every "auto" decided once by resolve()."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from folovllm.config import EngineConfig, usable_cores


def test_resolve_decides_every_auto_on_cpu() -> None:
    resolved = EngineConfig(device="cpu").resolve()
    assert (resolved.device, resolved.dtype, resolved.attention_backend, resolved.overlap_scheduling) == (
        "cpu", "bfloat16", "torch", False)
    assert resolved.resolve() == resolved  # resolving twice changes nothing
    assert resolved.torch_device == torch.device("cpu") and resolved.torch_dtype == torch.bfloat16


def test_resolve_keeps_explicit_choices() -> None:
    resolved = EngineConfig(device="cuda", attention_backend="torch", overlap_scheduling=False).resolve()
    assert (resolved.attention_backend, resolved.overlap_scheduling) == ("torch", False)
    assert EngineConfig(device="cuda", overlap_scheduling="auto").resolve().overlap_scheduling is True
    assert EngineConfig(device="cpu", overlap_scheduling=True).resolve().overlap_scheduling is True


def test_config_is_frozen_and_validated() -> None:
    config = EngineConfig(kv_cache_memory="512MiB")
    assert config.kv_cache_memory == 512 * 2**20
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.block_size = 32  # type: ignore[misc]
    with pytest.raises(ValueError, match="float16 is not supported on CPU"):
        EngineConfig(device="cpu", dtype="float16").resolve()
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        EngineConfig(block_size=0)


def test_num_threads_default_to_the_cores_this_process_may_use() -> None:
    assert EngineConfig(device="cpu").resolve().num_threads == usable_cores() >= 1
    assert EngineConfig(device="cpu", num_threads=1).resolve().num_threads == 1
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        EngineConfig(num_threads=0)
