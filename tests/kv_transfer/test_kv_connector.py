"""The KV connector's life cycle in the scheduler and KV cache, without a model: a producer holds a
finished request's blocks until the transfer ends; a consumer parks a request while its KV arrives,
names those blocks only once they are filled, computes one prompt token, and recomputes on failure."""
from __future__ import annotations

import pytest

from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.scheduler import Scheduler, SchedulerLimits
from folovllm.kv_transfer.base import (
    ConnectorSide,
    KVConnectorBase,
    KVTransferResult,
    KVTransferSettings,
)
from folovllm.request import Request, RequestStatus
from folovllm.sampling_params import SamplingParams

BLOCK = 4


def make_scheduler(role: str, num_blocks: int = 32) -> Scheduler:
    settings = KVTransferSettings(role=role, engine_id="e1", block_size=BLOCK, timeout_s=60.0)
    kv = KVCacheManager(num_blocks, BLOCK, enable_prefix_caching=True)
    return Scheduler(SchedulerLimits(256, 8, 128), kv, connector=KVConnectorBase(settings, ConnectorSide.SCHEDULER))


def make_request(rid: str, prompt: list[int], kv_params: dict | None = None, max_tokens: int = 4) -> Request:
    extra = {"kv_transfer_params": kv_params} if kv_params is not None else None
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra)
    return Request(rid, prompt, params, 0.0, max_tokens, [0])


def remote_params(num_prompt_tokens: int) -> dict:
    return {"do_remote_prefill": True, "connector": "base", "remote_request_id": "p-1",
            "num_prompt_tokens": num_prompt_tokens, "block_size": BLOCK}


def run_prefill(scheduler: Scheduler, request: Request) -> None:
    """One fake step for ``request``: its scheduled tokens computed, a token sampled if caught up."""
    out = scheduler.schedule()
    num_new = out.num_new_tokens[out.requests.index(request)]
    request.num_computed_tokens += num_new
    scheduler.kv_cache.cache_computed_blocks(request)
    if request.num_computed_tokens == request.num_tokens:
        request.append_output_token(7)


def test_producer_holds_blocks_until_the_transfer_ends():
    scheduler = make_scheduler("kv_producer")
    kv = scheduler.kv_cache
    start = kv.num_free_blocks
    request = make_request("a", list(range(10, 23)), {"do_remote_decode": True}, max_tokens=1)
    scheduler.add_request(request)
    run_prefill(scheduler, request)
    table = list(kv.block_table("a"))
    scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
    params = request.kv_transfer_params_out
    assert params["do_remote_prefill"] and params["remote_block_ids"] == table
    assert params["num_prompt_tokens"] == 13 and params["block_size"] == BLOCK
    assert kv.num_free_blocks == start - len(table)  # held, not freed
    meta = scheduler.connector.build_connector_meta()
    assert [s.transfer_id for s in meta.saves] == [params["remote_request_id"]]
    assert scheduler.connector.build_connector_meta().is_empty  # orders go out once
    scheduler.update_from_kv_transfers(KVTransferResult(finished_sending={params["remote_request_id"]}))
    assert kv.num_free_blocks == start and not kv.held


@pytest.mark.parametrize("status", [RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR])
def test_producer_frees_a_request_that_did_not_end_normally(status):
    scheduler = make_scheduler("kv_producer")
    start = scheduler.kv_cache.num_free_blocks
    request = make_request("a", list(range(10, 23)), {"do_remote_decode": True})
    scheduler.add_request(request)
    run_prefill(scheduler, request)
    scheduler.finish_request(request, status)
    assert request.kv_transfer_params_out is None
    assert scheduler.kv_cache.num_free_blocks == start and not scheduler.kv_cache.held


def test_a_request_without_params_is_not_held():
    scheduler = make_scheduler("kv_both")
    request = make_request("a", list(range(10, 23)), max_tokens=1)
    scheduler.add_request(request)
    run_prefill(scheduler, request)
    scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
    assert request.kv_transfer_params_out is None and not scheduler.kv_cache.held


def test_consumer_waits_for_kv_without_blocking_others_then_computes_one_token():
    scheduler = make_scheduler("kv_consumer")
    kv = scheduler.kv_cache
    start = kv.num_free_blocks
    prompt = list(range(10, 23))  # 13 tokens: 12 arrive, 1 is computed here
    remote = make_request("d", prompt, remote_params(13))
    other = make_request("o", list(range(40, 45)))
    scheduler.add_request(remote)
    scheduler.add_request(other)
    out = scheduler.schedule()
    assert out.requests == [other]  # the other request runs while the KV is on the way
    assert remote.status == RequestStatus.WAITING_FOR_REMOTE_KV
    assert len(kv.block_table("d")) == 3  # blocks for the 12 arriving tokens
    assert not kv.pool.cached  # nothing is named before its KV is there
    meta = scheduler.connector.build_connector_meta()
    (load,) = meta.loads
    assert load.block_ids == kv.block_table("d") and load.first_block == 0 and load.num_tokens == 12
    assert scheduler.schedule().requests == [other]  # still waiting
    scheduler.update_from_kv_transfers(KVTransferResult(finished_recving={"d"}))
    assert remote.num_computed_tokens == 12 and len(kv.pool.cached) == 3  # named now
    out = scheduler.schedule()
    assert out.num_new_tokens[out.requests.index(remote)] == 1
    assert remote.num_external_computed_tokens == 12
    for request in (remote, other):
        scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
    assert kv.num_free_blocks == start


def test_consumer_starts_after_its_local_prefix_hits():
    scheduler = make_scheduler("kv_consumer")
    prompt = list(range(10, 23))
    warm = make_request("w", prompt[:9], max_tokens=1)
    scheduler.add_request(warm)
    run_prefill(scheduler, warm)
    scheduler.finish_request(warm, RequestStatus.FINISHED_LENGTH)  # blocks 0-1 (8 tokens) now cached
    remote = make_request("d", prompt, remote_params(13))
    scheduler.add_request(remote)
    scheduler.schedule()
    (load,) = scheduler.connector.build_connector_meta().loads
    assert remote.num_cached_tokens == 8 and load.first_block == 2 and load.num_tokens == 4
    assert load.block_ids == scheduler.kv_cache.block_table("d")[2:]


def test_failed_pull_recomputes_the_prompt_locally():
    scheduler = make_scheduler("kv_consumer")
    kv = scheduler.kv_cache
    start = kv.num_free_blocks
    remote = make_request("d", list(range(10, 23)), remote_params(13))
    scheduler.add_request(remote)
    scheduler.schedule()
    assert len(scheduler.connector.build_connector_meta().loads) == 1
    scheduler.update_from_kv_transfers(KVTransferResult(failed_recving={"d"}))
    assert remote.status == RequestStatus.WAITING and kv.num_free_blocks == start
    out = scheduler.schedule()
    assert out.num_new_tokens == [13]  # the whole prompt, here
    assert remote.num_external_computed_tokens == 0
    assert not scheduler.connector.build_connector_meta().loads  # one attempt only


def test_abort_while_waiting_for_kv_frees_blocks_and_cancels_the_load():
    scheduler = make_scheduler("kv_consumer")
    kv = scheduler.kv_cache
    start = kv.num_free_blocks
    remote = make_request("d", list(range(10, 23)), remote_params(13))
    scheduler.add_request(remote)
    scheduler.schedule()
    scheduler.abort(remote)
    assert kv.num_free_blocks == start and not scheduler.has_unfinished()
    assert scheduler.connector.build_connector_meta().cancelled_loads == ["d"]
    scheduler.update_from_kv_transfers(KVTransferResult(finished_recving={"d"}))  # late news: ignored
    assert kv.num_free_blocks == start and not scheduler.waiting


@pytest.mark.parametrize("change", [{"num_prompt_tokens": 12}, {"block_size": 8}, {"connector": "other"}])
def test_params_that_do_not_fit_compute_locally(change):
    scheduler = make_scheduler("kv_consumer")
    remote = make_request("d", list(range(10, 23)), {**remote_params(13), **change})
    scheduler.add_request(remote)
    out = scheduler.schedule()
    assert out.requests == [remote] and out.num_new_tokens == [13]


def test_producer_role_ignores_remote_prefill_params():
    scheduler = make_scheduler("kv_producer")
    remote = make_request("d", list(range(10, 23)), remote_params(13))
    scheduler.add_request(remote)
    assert scheduler.schedule().num_new_tokens == [13]


def test_kv_transfer_params_must_be_an_object_and_need_n_1():
    with pytest.raises(ValueError, match="JSON object"):
        SamplingParams(extra_args={"kv_transfer_params": [1]})
    with pytest.raises(ValueError, match="n=1"):
        SamplingParams(n=2, extra_args={"kv_transfer_params": {"do_remote_decode": True}})
