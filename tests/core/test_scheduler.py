"""Scheduler + block manager under random workloads, with a fake model that emits token 7."""

from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.scheduler import Scheduler, SchedulerLimits
from folovllm.request import Request, RequestStatus
from folovllm.sampling_params import SamplingParams


def make_request(rid: str, prompt_len: int, max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, [1] * prompt_len, params, 0.0, max_tokens, [0])


def run_step(scheduler: Scheduler, limits: SchedulerLimits) -> list[Request]:
    """One fake engine step; checks the per-step invariants and returns requests that finished."""
    out = scheduler.schedule()
    assert out.total_num_tokens <= limits.max_num_batched_tokens
    assert len(scheduler.running) <= limits.max_num_seqs
    assert len({r.request_id for r in out.requests}) == len(out.requests)
    finished = []
    for request, num_new, table in zip(out.requests, out.num_new_tokens, out.block_tables):
        assert request.status == RequestStatus.RUNNING
        assert len(table) * scheduler.kv_cache.block_size >= request.num_computed_tokens + num_new
        request.num_computed_tokens += num_new
        if request.num_computed_tokens == request.num_tokens:
            request.append_output_token(7)
            if request.num_output_tokens >= request.max_tokens:
                scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
                finished.append(request)
    check_block_ownership(scheduler)
    return finished


def check_block_ownership(scheduler: Scheduler) -> None:
    kv = scheduler.kv_cache
    owned = [b for table in kv.block_tables.values() for b in table]
    assert len(owned) == len(set(owned)), "a block is owned twice"
    assert len(owned) + kv.num_free_blocks == kv.num_blocks, "a block leaked"
    for request in scheduler.waiting:
        assert kv.block_table(request.request_id) == [] or request.num_computed_tokens == 0


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20)), min_size=1, max_size=12),
    num_blocks=st.integers(15, 30),
    block_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(1, 48),
    max_num_seqs=st.integers(1, 6),
    arrivals=st.randoms(use_true_random=False),
    abort_rate=st.sampled_from([0.0, 0.05]),
)
def test_random_workloads_finish_without_leaks(lengths, num_blocks, block_size, budget,
                                               max_num_seqs, arrivals, abort_rate):
    max_model_len = 60
    num_blocks = max(num_blocks, -(-max_model_len // block_size))  # one request always fits
    limits = SchedulerLimits(budget, max_num_seqs, max_model_len, enable_chunked_prefill=True)
    scheduler = Scheduler(limits, KVCacheManager(num_blocks, block_size))
    pending = [make_request(str(i), p, m) for i, (p, m) in enumerate(lengths)]
    done: list[Request] = []
    aborted: list[Request] = []
    for _ in range(5000):
        while pending and arrivals.random() < 0.5:
            scheduler.add_request(pending.pop(0))
        if not pending and not scheduler.has_unfinished():
            break
        live = scheduler.running + list(scheduler.waiting)
        if live and arrivals.random() < abort_rate:
            victim = arrivals.choice(live)
            scheduler.abort(victim)
            aborted.append(victim)
        done.extend(run_step(scheduler, limits))
    assert not pending and not scheduler.has_unfinished()
    assert len(done) + len(aborted) == len(lengths)
    for request in done:
        assert request.num_output_tokens == request.max_tokens
        assert request.output_token_ids == [7] * request.max_tokens
    assert scheduler.kv_cache.num_free_blocks == num_blocks


def test_running_requests_go_first_and_prefill_is_chunked():
    limits = SchedulerLimits(max_num_batched_tokens=8, max_num_seqs=4, max_model_len=100)
    scheduler = Scheduler(limits, KVCacheManager(100, 4))
    a, b = make_request("a", 3, 5), make_request("b", 20, 5)
    scheduler.add_request(a)
    scheduler.add_request(b)
    out = scheduler.schedule()
    assert [r.request_id for r in out.requests] == ["a", "b"]
    assert out.num_new_tokens == [3, 5]  # b's prompt cut to what is left of the budget
    a.num_computed_tokens, b.num_computed_tokens = 3, 5
    a.append_output_token(7)
    out = scheduler.schedule()
    assert out.num_new_tokens == [1, 7]  # a decodes (1 token) and b continues its prompt


def test_no_chunking_waits_for_whole_prompt_budget():
    limits = SchedulerLimits(8, 4, 100, enable_chunked_prefill=False)
    scheduler = Scheduler(limits, KVCacheManager(100, 4))
    scheduler.add_request(make_request("a", 5, 2))
    scheduler.add_request(make_request("b", 6, 2))
    out = scheduler.schedule()
    assert out.num_new_tokens == [5]  # b would not fit whole: it waits for the next step


def test_preemption_frees_blocks_and_requeues_in_front():
    limits = SchedulerLimits(64, 4, 100)
    scheduler = Scheduler(limits, KVCacheManager(num_blocks=4, block_size=4))
    a, b = make_request("a", 8, 10), make_request("b", 8, 10)
    scheduler.add_request(a)
    scheduler.add_request(b)
    out = scheduler.schedule()
    assert out.num_new_tokens == [8, 8]  # pool is now full
    for r in (a, b):
        r.num_computed_tokens = 8
        r.append_output_token(7)
    out = scheduler.schedule()  # a needs a 3rd block: b (admitted last) is preempted
    assert [r.request_id for r in out.requests] == ["a"]
    assert out.preempted == [b]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert scheduler.waiting[0] is b and scheduler.kv_cache.block_table("b") == []


def test_abort_waiting_and_running():
    limits = SchedulerLimits(64, 4, 100)
    scheduler = Scheduler(limits, KVCacheManager(10, 4))
    a, b = make_request("a", 4, 3), make_request("b", 4, 3)
    scheduler.add_request(a)
    scheduler.schedule()
    scheduler.add_request(b)
    scheduler.abort(a)
    scheduler.abort(b)
    assert not scheduler.has_unfinished()
    assert scheduler.kv_cache.num_free_blocks == 10
    assert a.status == b.status == RequestStatus.FINISHED_ABORTED


def test_long_prefill_threshold_leaves_room_for_short_requests():
    limits = SchedulerLimits(64, 4, 200, enable_chunked_prefill=True, long_prefill_token_threshold=16)
    scheduler = Scheduler(limits, KVCacheManager(100, 4))
    long_, short = make_request("long", 100, 2), make_request("short", 5, 2)
    scheduler.add_request(long_)
    scheduler.add_request(short)
    out = scheduler.schedule()
    assert out.num_new_tokens == [16, 5]  # without the cap the long prompt would take all 64


class _Grammar:
    """Stands in for a structured-outputs grammar: not ready until the test says so."""

    ready = False


def test_a_request_waits_for_its_grammar_while_later_ones_run():
    limits = SchedulerLimits(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=60)
    scheduler = Scheduler(limits, KVCacheManager(32, 4))
    compiling = make_request("compiling", 5, 2)
    compiling.grammar = _Grammar()
    scheduler.add_request(compiling)
    scheduler.add_request(make_request("plain", 5, 2))
    assert [r.request_id for r in scheduler.schedule().requests] == ["plain"]
    assert scheduler.waiting == [compiling] and compiling.status == RequestStatus.WAITING
    compiling.grammar.ready = True
    assert [r.request_id for r in scheduler.schedule().requests] == ["plain", "compiling"]


def test_running_requests_are_sorted_only_when_their_order_can_have_changed():
    from folovllm.core.admission import AdaptiveAdmission

    limits = SchedulerLimits(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128)
    for admission, keys_stand in ((None, True), (AdaptiveAdmission(4, 64), False)):
        scheduler = Scheduler(limits, KVCacheManager(64, 4), admission=admission)
        keys = []
        running_key = scheduler._running_key
        scheduler._running_key = lambda request: keys.append(request) or running_key(request)
        for i in range(3):
            scheduler.add_request(make_request(str(i), 5, 20))
        run_step(scheduler, limits)  # all three admitted
        run_step(scheduler, limits)  # sorted once: they joined
        keys.clear()
        run_step(scheduler, limits)
        run_step(scheduler, limits)  # nobody joined: fcfs keys stand, adaptive's victim keys count outputs
        assert (not keys) == keys_stand and len(scheduler.running) == 3
        scheduler.add_request(make_request("late", 5, 20))
        run_step(scheduler, limits)
        keys.clear()
        run_step(scheduler, limits)  # sorted again after the newcomer joined
        assert len(keys) == 4
