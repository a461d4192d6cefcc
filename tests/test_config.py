"""EngineConfig: frozen, validated on construction, every "auto" decided once by resolve()."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from folovllm.config import EngineConfig, usable_cores
from folovllm.platforms import kernel_library
from tests.helpers import switches
from tests.tiers import library_missing


def test_resolve_decides_every_auto_on_cpu() -> None:
    resolved = EngineConfig(device="cpu").resolve()
    backend = "cpu" if library_missing() is None else "torch"
    assert (resolved.device, resolved.dtype, resolved.attention_backend, resolved.overlap_scheduling) == (
        "cpu", "bfloat16", backend, False)
    assert resolved.resolve() == resolved  # resolving twice changes nothing
    assert resolved.torch_device == torch.device("cpu") and resolved.torch_dtype == torch.bfloat16


def test_auto_falls_back_to_torch_when_the_cpu_kernel_does_not_run(monkeypatch) -> None:
    with switches(CPU_ISA="none"):  # below the kernels' least tier, as on Arm
        assert EngineConfig(device="cpu").resolve().attention_backend == "torch"
    monkeypatch.setattr(kernel_library, "has_kernel", lambda name: False)  # a library without it (not built)
    assert EngineConfig(device="cpu").resolve().attention_backend == "torch"
    assert EngineConfig(device="cpu", attention_backend="cpu").resolve().attention_backend == "cpu"


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


def test_tensor_parallelism_turns_overlap_and_cuda_graphs_off_and_shares_the_threads() -> None:
    resolved = EngineConfig(device="cpu", tensor_parallel_size=2, num_threads=4).resolve()
    assert (resolved.overlap_scheduling, resolved.enforce_eager, resolved.threads_per_rank) == (False, True, 2)
    assert EngineConfig(device="cpu", tensor_parallel_size=4, num_threads=2).threads_per_rank == 1
    assert EngineConfig(device="cpu", num_threads=2).resolve().enforce_eager is False
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="overlap scheduling does not work with tensor_parallel_size > 1"):
        EngineConfig(device="cpu", tensor_parallel_size=2, overlap_scheduling=True).resolve()
    with pytest.raises(ValueError, match="pass device='cuda'"):
        EngineConfig(device="cuda:1", tensor_parallel_size=2).resolve()


def test_nodes_split_the_ranks_evenly_and_need_node_zeros_address() -> None:
    nodes = dict(master_addr="10.0.0.1", master_port=29500)
    config = EngineConfig(device="cpu", tensor_parallel_size=4, nnodes=2, node_rank=1, num_threads=4, **nodes)
    assert (config.ranks_per_node, config.threads_per_rank) == (2, 2)  # a node's cores go to its own ranks
    assert EngineConfig(tensor_parallel_size=3).ranks_per_node == 3
    with pytest.raises(ValueError, match=r"node_rank=2 must lie in \[0, nnodes=2\)"):
        EngineConfig(tensor_parallel_size=2, nnodes=2, node_rank=2, **nodes)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not split evenly over nnodes=2"):
        EngineConfig(tensor_parallel_size=3, nnodes=2, **nodes)
    with pytest.raises(ValueError, match="nnodes=2 needs --master-addr and --master-port"):
        EngineConfig(tensor_parallel_size=2, nnodes=2, master_port=29500)
    with pytest.raises(ValueError, match="nnodes=2 needs --master-addr and --master-port"):
        EngineConfig(tensor_parallel_size=2, nnodes=2, master_addr="10.0.0.1")
    with pytest.raises(ValueError, match="nnodes must be >= 1"):
        EngineConfig(nnodes=0)
    with pytest.raises(ValueError, match="master_port must be a TCP port"):
        EngineConfig(master_port=70000)


def test_kv_transfer_config_sets_the_kv_role_and_connector() -> None:
    config = EngineConfig(kv_transfer_config={"kv_connector": "SharedStorageConnector", "kv_role": "kv_both"})
    assert (config.kv_role, config.kv_connector) == ("both", "SharedStorageConnector")
    assert EngineConfig(kv_role="consumer").kv_connector is None  # the engine picks torch_distributed
    with pytest.raises(ValueError, match="disagrees"):
        EngineConfig(kv_role="producer", kv_transfer_config={"kv_role": "kv_consumer"})
    with pytest.raises(ValueError, match="kv_role must be one of"):
        EngineConfig(kv_transfer_config={"kv_role": "decoder"})
    with pytest.raises(ValueError, match="not implemented"):
        EngineConfig(kv_transfer_config={"kv_role": "kv_both", "kv_buffer_size": 1})
    with pytest.raises(ValueError, match="needs a kv_role"):
        EngineConfig(kv_connector="shared_storage")
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        EngineConfig(kv_role="both", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="data_parallel_size=1"):
        EngineConfig(kv_role="producer", data_parallel_size=2)
    with pytest.raises(ValueError, match="kv_transfer_timeout"):
        EngineConfig(kv_role="both", kv_transfer_timeout=0)


def test_batch_invariant_is_the_knob_or_vllms_variable(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    assert EngineConfig(device="cpu").resolve().batch_invariant is False
    assert EngineConfig(device="cpu", batch_invariant=True).resolve().batch_invariant is True
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert EngineConfig(device="cpu").resolve().batch_invariant is True
    with pytest.raises(ValueError, match="batch-invariant mode with tensor_parallel_size=2 is not supported"):
        EngineConfig(device="cpu", tensor_parallel_size=2).resolve()
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "yes")
    with pytest.raises(ValueError, match="VLLM_BATCH_INVARIANT='yes'; choose one of 0, 1"):
        EngineConfig(device="cpu").resolve()
