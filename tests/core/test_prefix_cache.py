"""Prefix cache bookkeeping: hits, sharing, LRU eviction, salts, and ref-count invariants."""
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.scheduler import Scheduler, SchedulerLimits
from folovllm.request import Request, RequestStatus
from folovllm.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int], max_tokens: int = 2, salt: str | None = None) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, list(tokens), params, 0.0, max_tokens, [0], cache_salt=salt)


def compute(kv: KVCacheManager, request: Request) -> list[int]:
    """Admits a request the way the scheduler does and marks its whole prompt computed."""
    hits = kv.find_cached_prefix(request)
    cached = len(hits) * kv.block_size
    assert kv.allocate_slots(request, request.num_tokens - cached, hits)
    request.num_computed_tokens = request.num_tokens
    kv.cache_computed_blocks(request)
    return hits


def test_second_request_hits_the_shared_full_blocks():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = make_request("a", list(range(1, 11)))  # 10 tokens: 2 full blocks + 2
    compute(kv, a)
    b = make_request("b", list(range(1, 9)) + [99, 98, 97])  # shares exactly the 2 full blocks
    hits = compute(kv, b)
    assert hits == kv.block_table("a")[:2]
    assert kv.block_table("b")[:2] == hits and kv.block_table("b")[2] not in kv.block_table("a")
    assert [kv.pool.ref_counts[h] for h in hits] == [2, 2]


def test_last_token_is_always_computed():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    compute(kv, make_request("a", list(range(1, 9))))  # exactly 2 full blocks
    twin = make_request("b", list(range(1, 9)))
    assert len(kv.find_cached_prefix(twin)) == 1  # block 2 holds the last token: recomputed


def test_partial_blocks_are_never_cached():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    compute(kv, make_request("a", list(range(1, 7))))  # 1 full block + 2 tokens
    assert len(kv.pool.cached) == 1


def test_finished_blocks_stay_cached_until_needed_then_lru_tail_first():
    kv = KVCacheManager(num_blocks=5, block_size=4)
    a = make_request("a", list(range(1, 14)))  # 3 full blocks + 1 token = 4 blocks
    compute(kv, a)
    head, mid, tail = kv.block_table("a")[:3]
    kv.free(a)
    assert kv.pool.num_evictable_blocks == 3 and kv.num_free_blocks == 5
    # 3 fresh blocks: the 2 plain free ones go first, then the LRU cached block: a's tail.
    assert kv.allocate_slots(make_request("x", [7] * 12), 12)
    assert kv.pool.block_hashes[tail] is None and tail in kv.block_table("x")
    assert kv.pool.block_hashes[head] is not None and kv.pool.block_hashes[mid] is not None
    assert len(kv.find_cached_prefix(make_request("c", list(range(1, 14))))) == 2


def test_salt_separates_tenants():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    compute(kv, make_request("a", list(range(1, 11)), salt="tenant-1"))
    assert kv.find_cached_prefix(make_request("b", list(range(1, 11)), salt="tenant-2")) == []
    assert kv.find_cached_prefix(make_request("c", list(range(1, 11)))) == []
    assert len(kv.find_cached_prefix(make_request("d", list(range(1, 11)), salt="tenant-1"))) == 2


def test_disabled_cache_never_hits():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    compute(kv, make_request("a", list(range(1, 11))))
    assert kv.find_cached_prefix(make_request("b", list(range(1, 11)))) == []
    assert kv.pool.cached == {}


def test_reset_drops_only_unused_blocks():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a, b = make_request("a", list(range(1, 10))), make_request("b", list(range(50, 59)))
    compute(kv, a)
    compute(kv, b)
    kv.free(a)
    assert kv.reset_prefix_cache() == 2  # a's two full blocks; b still runs
    assert len(kv.pool.cached) == 2 and kv.find_cached_prefix(make_request("c", list(range(1, 10)))) == []


def test_model_key_is_part_of_the_hash():
    a = KVCacheManager(num_blocks=4, block_size=4, model_key="model-a")
    b = KVCacheManager(num_blocks=4, block_size=4, model_key="model-b")
    ra, rb = make_request("a", list(range(1, 6))), make_request("b", list(range(1, 6)))
    assert a._block_hashes(ra, 1) != b._block_hashes(rb, 1)


def check_pool(kv: KVCacheManager) -> None:
    pool = kv.pool
    in_use = {b for table in kv.block_tables.values() for b in table}
    evictable = set(pool._evictable)
    free = set(pool._free)
    assert not (evictable & in_use), "a block is both evictable and in use"
    assert not (free & in_use) and not (free & evictable)
    assert len(free) + len(evictable) + len(in_use) == pool.num_blocks, "a block leaked"
    for block in range(pool.num_blocks):
        holders = sum(table.count(block) for table in kv.block_tables.values())
        assert pool.ref_counts[block] == holders
    for block_hash, block in pool.cached.items():
        assert pool.block_hashes[block] == block_hash
    assert all(pool.block_hashes[b] is None for b in free)


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 30), st.integers(1, 8)),
                     min_size=1, max_size=14),
    num_blocks=st.integers(12, 30),
    budget=st.integers(2, 40),
    rng=st.randoms(use_true_random=False),
)
def test_random_interleavings_keep_ref_counts_consistent(prompts, num_blocks, budget, rng):
    """Requests share one of 4 prefixes; random arrivals, aborts and preemptions, tiny pool."""
    block_size = 4
    prefixes = [[p + 1] * 12 + list(range(100 * p, 100 * p + 9)) for p in range(4)]
    limits = SchedulerLimits(budget, 4, max_model_len=60)
    scheduler = Scheduler(limits, KVCacheManager(num_blocks, block_size))
    kv = scheduler.kv_cache
    pending = [make_request(str(i), prefixes[p][:20] + [7] * extra, max_tokens=m)
               for i, (p, extra, m) in enumerate(prompts)]
    expected = {r.request_id: r.max_tokens for r in pending}
    done: list[Request] = []
    for _ in range(3000):
        while pending and rng.random() < 0.4:
            scheduler.add_request(pending.pop(0))
        if not pending and not scheduler.has_unfinished():
            break
        live = scheduler.running + list(scheduler.waiting)
        if live and rng.random() < 0.03:
            scheduler.abort(rng.choice(live))
        out = scheduler.schedule()
        for request, num_new in zip(out.requests, out.num_new_tokens):
            request.num_computed_tokens += num_new
            kv.cache_computed_blocks(request)
            if request.num_computed_tokens == request.num_tokens:
                request.append_output_token(5)
                if request.num_output_tokens >= request.max_tokens:
                    scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
                    done.append(request)
        check_pool(kv)
    assert not scheduler.has_unfinished()
    assert kv.block_tables == {} and kv.num_free_blocks == num_blocks
    for request in done:
        assert request.num_output_tokens == expected[request.request_id]
    assert kv.prefix_cache_hits <= kv.prefix_cache_queries
