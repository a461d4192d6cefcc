"""The torch_distributed consumer copies arrived KV from staging into its cache on the engine thread:
all of it in the step that sees it, or a few layers per step under a byte budget. Either way the
cache ends up the same, the request is reported only once every layer is in place, and a request
aborted midway gets no more writes. No process group: arrivals are put in place by hand."""
from __future__ import annotations

import pytest
import torch

from folovllm.kv_transfer.base import ConnectorSide, KVTransferSettings, LoadSpec
from folovllm.kv_transfer.torch_distributed import TorchDistributedConnector, _Arrival

LAYERS, BLOCKS, BLOCK_SIZE = 4, 16, 2


def consumer(copy_bytes_per_step: int) -> TorchDistributedConnector:
    settings = KVTransferSettings(role="kv_consumer", engine_id="d", block_size=BLOCK_SIZE, timeout_s=5.0,
                                  load_copy_bytes_per_step=copy_bytes_per_step)
    connector = TorchDistributedConnector(settings, ConnectorSide.WORKER)
    connector.register_kv_caches([(torch.zeros(BLOCKS, BLOCK_SIZE, 1, 4), torch.zeros(BLOCKS, BLOCK_SIZE, 1, 4))
                                  for _ in range(LAYERS)])
    return connector


def arrive(connector: TorchDistributedConnector, request_id: str, block_ids: list[int], fill: float) -> None:
    staged = [(torch.full((len(block_ids), BLOCK_SIZE, 1, 4), fill + layer),
               torch.full((len(block_ids), BLOCK_SIZE, 1, 4), -fill - layer)) for layer in range(LAYERS)]
    load = LoadSpec(request_id, {}, block_ids, 0, len(block_ids) * BLOCK_SIZE)
    connector._arrivals.put(_Arrival(load, staged, started=0.0))


def layer_bytes(num_blocks: int) -> int:
    return 2 * num_blocks * BLOCK_SIZE * 4 * 4  # K and V, float32


def test_whole_arrivals_in_one_step_by_default():
    connector = consumer(0)
    arrive(connector, "r1", [3, 5], 1.0)
    result = connector.get_finished()
    assert result.finished_recving == {"r1"} and result.recv_bytes == LAYERS * layer_bytes(2)
    for layer, (k, v) in enumerate(connector.kv_caches):
        assert torch.all(k[[3, 5]] == 1.0 + layer) and torch.all(v[[3, 5]] == -1.0 - layer)
        assert k[4].abs().sum() == 0


def test_a_budget_spreads_the_copy_over_steps_and_ends_with_the_same_cache():
    whole, spread = consumer(0), consumer(layer_bytes(2))  # one layer per step
    for connector in (whole, spread):
        arrive(connector, "r1", [3, 5], 1.0)
        arrive(connector, "r2", [7], 10.0)
    assert whole.get_finished().finished_recving == {"r1", "r2"}
    reported = []
    for step in range(2 * LAYERS + 2):
        result = spread.get_finished()
        reported.append(sorted(result.finished_recving))
        if step == 0:  # one layer of r1 in place, the rest still staged
            assert torch.all(spread.kv_caches[0][0][[3, 5]] == 1.0) and spread.kv_caches[1][0][3].abs().sum() == 0
    # r1 (LAYERS steps) first, then r2 (its one block per layer fits the rest of a step's budget)
    assert reported[LAYERS - 1] == ["r1"] and ["r2"] in reported[LAYERS:]
    assert sum(len(r) for r in reported) == 2
    for (k, v), (wk, wv) in zip(spread.kv_caches, whole.kv_caches):
        assert torch.equal(k, wk) and torch.equal(v, wv)


def test_a_backlog_is_never_spread_over_more_than_max_copy_steps():
    from folovllm.kv_transfer.torch_distributed import MAX_COPY_STEPS

    connector = consumer(1)  # a budget below one layer: one layer per step, unless a backlog builds
    for i in range(10):
        arrive(connector, f"r{i}", [i], float(i))
    done = set()
    for _ in range(MAX_COPY_STEPS + 1):
        done |= connector.get_finished().finished_recving
    assert done == {f"r{i}" for i in range(10)}


def test_a_request_aborted_midway_gets_no_more_writes():
    from folovllm.kv_transfer.base import KVConnectorMetadata

    connector = consumer(layer_bytes(2))
    arrive(connector, "r1", [3, 5], 1.0)
    assert not connector.get_finished().finished_recving
    connector.start_load_kv(KVConnectorMetadata(cancelled_loads=["r1"]))
    for _ in range(LAYERS):
        assert not connector.get_finished().finished_recving
    assert torch.all(connector.kv_caches[0][0][[3, 5]] == 1.0)  # copied before the abort
    assert all(k[[3, 5]].abs().sum() == 0 for k, _ in connector.kv_caches[1:])
    assert not connector._cancelled and not connector._copying


@pytest.mark.parametrize("value", [-1, "4", True])
def test_the_budget_setting_must_be_a_number_of_mb(value):
    from folovllm.config import EngineConfig
    from folovllm.kv_transfer.setup import kv_transfer_settings

    config = EngineConfig(kv_role="consumer",
                          kv_transfer_config={"kv_connector_extra_config": {"load_copy_mb_per_step": value}})
    with pytest.raises(ValueError, match="load_copy_mb_per_step"):
        kv_transfer_settings(config)
    ok = {"kv_connector_extra_config": {"load_copy_mb_per_step": 2}}
    assert kv_transfer_settings(EngineConfig(kv_role="consumer", kv_transfer_config=ok)).load_copy_bytes_per_step == 2**21
    assert kv_transfer_settings(EngineConfig(kv_role="consumer")).load_copy_bytes_per_step == 2**21  # the default
