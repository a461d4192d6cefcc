import pytest

from folovllm.core.kv_cache import BlockPool, KVCacheManager
from folovllm.request import Request
from folovllm.sampling_params import SamplingParams


def make_request(rid: str, prompt_len: int) -> Request:
    return Request(rid, list(range(1, prompt_len + 1)), SamplingParams(), 0.0, 16, [0])


def test_blocks_allocated_on_demand_and_freed():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("a", 6)
    assert kv.allocate_slots(req, 6)
    assert len(kv.block_table("a")) == 2
    req.num_computed_tokens = 6
    assert kv.allocate_slots(req, 1)  # token 7 fits in block 2
    assert len(kv.block_table("a")) == 2
    req.num_computed_tokens = 8
    assert kv.allocate_slots(req, 1)  # token 9 opens block 3
    assert len(kv.block_table("a")) == 3
    kv.free(req)
    assert kv.num_free_blocks == 8 and kv.block_table("a") == []


def test_allocation_fails_without_side_effects():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    req = make_request("a", 12)
    assert not kv.allocate_slots(req, 12)
    assert kv.num_free_blocks == 2 and kv.block_table("a") == []


def test_ref_counts_guard_double_free():
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    pool.release(blocks)
    with pytest.raises(RuntimeError):
        pool.release(blocks)


def test_peak_tracks_blocks_and_stored_tokens():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a, b = make_request("a", 5), make_request("b", 3)
    kv.allocate_slots(a, 5)
    kv.allocate_slots(b, 3)
    stats = kv.stats()
    assert stats["peak_blocks_used"] == 3 and stats["peak_used_slots"] == 8
    kv.free(a)
    kv.free(b)
    assert kv.stats()["blocks_used"] == 0 and kv.total_slots_used == 0
