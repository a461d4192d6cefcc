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


def test_new_blocks_name_each_tables_growth_until_taken():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a, b = make_request("a", 6), make_request("b", 3)
    kv.allocate_slots(a, 6)
    kv.allocate_slots(b, 3)
    assert kv.take_new_blocks() == {"a": (0, kv.block_table("a")), "b": (0, kv.block_table("b"))}
    a.num_computed_tokens = 6
    assert kv.allocate_slots(a, 1) and kv.take_new_blocks() == {}  # token 7 fits in block 2
    a.num_computed_tokens = 8
    kv.allocate_slots(a, 1)
    a.num_computed_tokens = 9
    kv.allocate_slots(a, 4)  # two growths before the scheduler takes them: one entry from the first
    assert kv.take_new_blocks() == {"a": (2, kv.block_table("a")[2:])} and len(kv.block_table("a")) == 4
    b.num_computed_tokens = 4
    kv.allocate_slots(b, 1)
    kv.free(b)
    assert kv.take_new_blocks() == {}


def test_peak_slots_follow_the_rule_step_by_step():
    """The fullest the peak blocks got, kept as every allocation happens (most of them need no block)."""
    import random

    rng = random.Random(0)
    kv = KVCacheManager(num_blocks=40, block_size=4)
    live: list[Request] = []
    peak_blocks = peak_slots = 0
    for step in range(400):
        if live and rng.random() < 0.15:
            kv.free(live.pop(rng.randrange(len(live))))
            continue
        if not live or rng.random() < 0.2:
            live.append(make_request(f"r{step}", rng.randrange(1, 9)))
            request, num_new = live[-1], live[-1].num_prompt_tokens
        else:
            request = rng.choice(live)
            request.num_computed_tokens = request.num_computed_tokens or request.num_prompt_tokens
            request.num_computed_tokens += 1
            num_new = 1
        if not kv.allocate_slots(request, num_new):
            continue
        used = kv.num_used_blocks
        if used > peak_blocks:
            peak_blocks, peak_slots = used, kv.total_slots_used
        elif used == peak_blocks:
            peak_slots = max(peak_slots, kv.total_slots_used)
        stats = kv.stats()
        assert (stats["peak_blocks_used"], stats["peak_used_slots"]) == (peak_blocks, peak_slots), step
