"""Decodes scheduled in bulk (FOLOVLLM_BULK_DECODES) plan every step as the general path does: the same requests,
token counts, block tables, preemptions, KV counters and policy state, step for step, under random workloads that
run out of blocks, with every policy and admission mode."""
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.core.admission import AdaptiveAdmission, OnDemandAdmission, ReserveAdmission
from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.policy import make_policy
from folovllm.core.scheduler import Scheduler, SchedulerLimits, SchedulerOutput
from folovllm.engine.stats import step_cost_terms
from folovllm.request import Request
from folovllm.sampling_params import SamplingParams
from tests.helpers import fake_model_step


def make_requests(jobs: list[tuple[int, int, int, int]]) -> list[Request]:
    return [Request(str(i), [3 + i % 5] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    float(arrival), max_tokens, [0], priority=priority, user=f"t{priority % 2}")
            for i, (arrival, prompt_len, max_tokens, priority) in enumerate(jobs)]


def make_scheduler(bulk: bool, policy: str, admission: str, num_blocks: int, block_size: int, budget: int,
                   max_seqs: int, reserve: int) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=True, reserve_tokens_per_request=reserve)
    modes = {"on-demand": OnDemandAdmission, "reserve": lambda: ReserveAdmission(block_size, num_blocks * block_size, 64, max_seqs),
             "adaptive": lambda: AdaptiveAdmission(block_size, num_blocks)}
    return Scheduler(SchedulerLimits(budget, max_seqs, max_model_len=64), kv, make_policy(policy, None),
                     modes[admission](), clock=lambda: 0.0, bulk_decodes=bulk)


def plan(out: SchedulerOutput) -> tuple:
    return ([r.request_id for r in out.requests], out.num_new_tokens, [list(t) for t in out.block_tables],
            [r.request_id for r in out.preempted], out.new_block_ids, out.num_decode_tokens(), step_cost_terms(out))


def kv_state(scheduler: Scheduler) -> tuple:
    kv = scheduler.kv_cache
    return (kv.block_tables, kv.total_slots_used, kv.peak_blocks_used, kv.peak_used_slots, kv.num_free_blocks,
            getattr(scheduler.policy, "served", None))


def step(scheduler: Scheduler, out: SchedulerOutput, abort: int | None) -> None:
    """A fake model step: each caught-up request emits token 7; one request may be aborted after it."""
    fake_model_step(scheduler, out, 7)
    scheduler.kv_cache.cache_full_blocks(out.requests)
    if abort is not None and scheduler.running:
        scheduler.abort(scheduler.running[abort % len(scheduler.running)])


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 24), st.integers(1, 30), st.integers(0, 3)),
                     min_size=1, max_size=10),
       policy=st.sampled_from(["fcfs", "priority", "sjf", "fair"]),
       admission=st.sampled_from(["on-demand", "reserve", "adaptive"]),
       num_blocks=st.integers(16, 40), block_size=st.sampled_from([1, 2, 4, 8]), budget=st.integers(1, 40),
       max_seqs=st.integers(1, 8), reserve=st.sampled_from([0, 64]), aborts=st.randoms(use_true_random=False))
def test_bulk_decodes_plan_every_step_as_the_general_path(jobs, policy, admission, num_blocks, block_size, budget,
                                                           max_seqs, reserve, aborts):
    num_blocks = max(num_blocks, -(-64 // block_size) * (2 if reserve else 1))  # one request always fits
    schedulers = [make_scheduler(bulk, policy, admission, num_blocks, block_size, budget, max_seqs, reserve)
                  for bulk in (True, False)]
    arrivals = [make_requests(jobs) for _ in schedulers]
    for now in range(3000):
        for scheduler, requests in zip(schedulers, arrivals):
            while requests and requests[0].metrics.arrival_time <= now:
                request = requests.pop(0)
                try:
                    scheduler.check_admissible(request)  # as the engine does first (reserve refuses some)
                except ValueError:
                    continue
                scheduler.add_request(request)
        if not any(arrivals) and not any(s.has_unfinished() for s in schedulers):
            break
        outs = [s.schedule() for s in schedulers]
        assert plan(outs[0]) == plan(outs[1])
        assert outs[1].num_bulk_decodes == 0
        abort = aborts.randrange(8) if aborts.random() < 0.03 else None
        for scheduler, out in zip(schedulers, outs):
            step(scheduler, out, abort)
        assert kv_state(schedulers[0]) == kv_state(schedulers[1])
    assert not any(s.has_unfinished() for s in schedulers)


def test_bulk_decodes_take_the_running_decodes_and_allocate_at_block_ends():
    scheduler = make_scheduler(True, "fcfs", "on-demand", 64, 4, 64, 8, 0)
    requests = make_requests([(0, 6, 20, 0), (0, 4, 20, 0), (0, 5, 20, 0)])
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()  # the prompts: the general path
    assert out.num_bulk_decodes == 0 and out.num_new_tokens == [6, 4, 5]
    step(scheduler, out, None)
    allocations = []
    allocate = scheduler.kv_cache.allocate_slots
    scheduler.kv_cache.allocate_slots = lambda request, n, cached=None: (
        allocations.append(request.request_id) or allocate(request, n, cached))
    out = scheduler.schedule()  # each computes its first output token: all three in bulk
    assert out.num_bulk_decodes == 3 and out.num_new_tokens == [1, 1, 1]
    assert out.bulk_context_tokens == 7 + 5 + 6 and step_cost_terms(out) == (3, 18, (0, 0))
    # request 1's fifth token (blocks of 4) needed a block; the others' blocks held theirs
    assert allocations == ["1"] and out.new_block_ids == {"1": (1, out.block_tables[1][1:])}
