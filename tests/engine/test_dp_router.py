"""The data-parallel router: least-loaded choice, prefix stickiness and its balance escape, round
robin, and the load bookkeeping from add to output to finish or abort."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.engine.dp_router import (
    DataParallelRouter,
    PrefixIndex,
    RouterSettings,
    block_hashes,
)

BLOCK = 4


def router(policy: str = "prefix_aware", replicas: int = 2, **overrides) -> DataParallelRouter:
    options = {"min_match_tokens": BLOCK, "max_model_len": 1000, **overrides}
    return DataParallelRouter(replicas, RouterSettings(policy=policy, block_size=BLOCK, **options))


def test_block_hashes_chain_full_blocks_only() -> None:
    a = block_hashes(list(range(10)), BLOCK)
    assert len(a) == 2  # the last two tokens fill no block
    assert block_hashes(list(range(8)) + [99, 98], BLOCK) == a
    b = block_hashes([7] + list(range(1, 10)), BLOCK)
    assert a[0] != b[0] and a[1] != b[1]  # a block's hash depends on every block before it


def test_prefix_index_matches_leading_blocks_and_evicts_least_recent() -> None:
    index = PrefixIndex(capacity_blocks=3)
    first, second = block_hashes(list(range(12)), BLOCK), block_hashes(list(range(100, 108)), BLOCK)
    index.insert(first)
    assert index.match(first) == 3 and index.match(first[:2]) == 2
    index.insert(second)  # 5 blocks for room 3: first's two oldest go
    assert len(index) == 3 and index.match(second) == 2 and index.match(first) == 0
    with pytest.raises(ValueError, match="at least one block"):
        PrefixIndex(0)


def test_least_loaded_takes_the_replica_with_fewest_outstanding_tokens() -> None:
    r = router("least_loaded")
    assert r.route(["a"], [list(range(100))], max_tokens=10) == 0
    assert r.load == [110, 0]
    assert r.route(["b"], [list(range(5))], max_tokens=10) == 1
    assert r.route(["c"], [list(range(5, 10))], max_tokens=10) == 1  # 15 < 110
    assert r.load == [110, 30]


def test_idle_replicas_take_sequential_requests_in_turn() -> None:
    r = router("least_loaded", replicas=3)
    chosen = []
    for i in range(6):
        chosen.append(r.route([str(i)], [[i] * 3], max_tokens=1))
        r.release(str(i))
    assert chosen == [0, 1, 2, 0, 1, 2]


def test_round_robin_ignores_load() -> None:
    r = router("round_robin", replicas=3)
    assert [r.route([str(i)], [list(range(50 * i + 1))], max_tokens=5) for i in range(5)] == [0, 1, 2, 0, 1]


def test_shared_prefix_sticks_to_the_replica_that_holds_it() -> None:
    r = router()
    system = list(range(1000, 1016))  # four full blocks
    first = r.route(["a"], [system + [1, 2, 3]], max_tokens=8)
    other = r.route(["b"], [list(range(50))], max_tokens=8)  # unrelated: the other, idle replica
    assert other != first
    for i in range(3):  # the holder stays within the balance factor, so it keeps the prefix's requests
        assert r.route([f"s{i}"], [system + [i, i]], max_tokens=8) == first


def test_an_overloaded_prefix_holder_is_passed_over() -> None:
    r = router(balance_factor=2.0, balance_slack_tokens=10)
    system = list(range(1000, 1016))
    holder = r.route(["a"], [system + [1]], max_tokens=500)  # the holder is now far busier
    assert r.route(["b"], [system + [2]], max_tokens=5) == 1 - holder
    r.release("a")
    assert r.route(["c"], [system + [3]], max_tokens=5) in (0, 1)  # both hold it now: the lighter one
    assert r.indexes[0].match(block_hashes(system, BLOCK)) == r.indexes[1].match(block_hashes(system, BLOCK)) == 4


def test_a_match_shorter_than_the_threshold_routes_by_load() -> None:
    r = router(min_match_tokens=3 * BLOCK)
    holder = r.route(["a"], [list(range(8)) + [50] * 30], max_tokens=5)
    # shares only two blocks (below three), and the holder is busier: least loaded wins
    assert r.route(["b"], [list(range(8)) + [60] * 4], max_tokens=5) == 1 - holder


def test_a_cached_prefix_is_not_counted_as_prompt_work() -> None:
    r = router()
    system = list(range(1000, 1016))
    holder = r.route(["a"], [system + [1]], max_tokens=1)
    r.release("a")
    assert r.load == [0, 0]
    assert r.route(["b"], [system + [2, 3]], max_tokens=1) == holder
    assert r.load[holder] == 2 + 1  # 16 cached tokens: the two new ones and one to generate


def test_outputs_finish_and_abort_bring_the_load_back() -> None:
    r = router("least_loaded")
    replica = r.route(["a", "a2"], [list(range(10)), list(range(20, 26))], max_tokens=4, n=2)
    assert r.replica_of("a") == r.replica_of("a2") == replica  # one request's prompts stay together
    assert r.load[replica] == (10 + 8) + (6 + 8)
    r.on_output("a", 2)  # prefill done, two of its eight tokens out
    assert r.load[replica] == 6 + (6 + 8)
    r.on_output("a", 100)  # never below what is owed
    assert r.load[replica] == 6 + 8
    r.release("a")
    r.release("a2")
    r.release("a2")  # ending twice, or an id never routed, changes nothing
    r.on_output("ghost", 3)
    assert r.load == [0, 0] and r.num_open == 0 and r.replica_of("a") is None


def test_no_max_tokens_counts_up_to_max_model_len_and_text_prompts_count_empty() -> None:
    r = router("least_loaded")
    r.route(["a"], [list(range(100))], max_tokens=None)
    assert r.load[0] == 100 + 900
    r.route(["b"], [None], max_tokens=3)
    assert r.load[1] == 3


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="dp_routing must be one of"):
        RouterSettings(policy="random")
    with pytest.raises(ValueError, match="balance_factor"):
        RouterSettings(balance_factor=0.5)
    with pytest.raises(ValueError, match="request ids"):
        router().route(["a", "b"], [[1]], max_tokens=1)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["prefix_aware", "least_loaded", "round_robin"]),
       st.lists(st.tuples(st.sampled_from(["add", "output", "finish"]), st.integers(0, 7),
                          st.lists(st.integers(0, 3), max_size=20), st.integers(0, 6)), max_size=40))
def test_load_is_the_sum_of_what_open_requests_still_owe(policy, ops) -> None:
    r = router(policy, replicas=3)
    owed: dict[str, tuple[int, int]] = {}  # request id -> (prompt tokens left, generation left)
    for kind, rid, prompt, count in ops:
        request_id = str(rid)
        if kind == "add" and request_id not in owed:
            r.route([request_id], [prompt], max_tokens=count)
            owed[request_id] = (None, count)
        elif kind == "output":
            r.on_output(request_id, count)
            if request_id in owed:
                owed[request_id] = (0, max(owed[request_id][1] - count, 0))
        elif kind == "finish":
            r.release(request_id)
            owed.pop(request_id, None)
        assert all(load >= 0 for load in r.load)
        assert sum(r.load) >= sum(gen for _, gen in owed.values())
        for replica in range(3):  # once every request has had an output, the load is exactly what is owed
            if all(left == 0 for request, (left, _) in owed.items() if r.replica_of(request) == replica):
                assert r.load[replica] == sum(gen for request, (_, gen) in owed.items()
                                              if r.replica_of(request) == replica)
    for request_id in list(owed):
        r.release(request_id)
    assert r.load == [0, 0, 0]
