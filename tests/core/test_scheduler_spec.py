"""The scheduler gives a speculating decode 1 + k tokens, trimmed by the budget, max_tokens and max_model_len."""
from folovllm.core.kv_cache import KVCacheManager
from folovllm.core.scheduler import Scheduler, SchedulerLimits
from folovllm.request import Request
from folovllm.sampling_params import SamplingParams


def decoding(rid: str, max_tokens: int = 50) -> Request:
    request = Request(rid, [1] * 8, SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0, max_tokens, [0])
    request.append_output_token(5)
    return request


def scheduler_with(requests: list[Request], budget: int, max_model_len: int = 64) -> Scheduler:
    scheduler = Scheduler(SchedulerLimits(budget, 8, max_model_len), KVCacheManager(64, 4))
    for request in requests:
        scheduler.add_request(request)
    first = scheduler.schedule()  # prefill: prompt and the first output token
    for request in first.requests:
        request.num_computed_tokens = request.num_tokens - 1
    return scheduler


def test_proposals_count_against_the_budget_and_are_recorded():
    a, b = decoding("a"), decoding("b")
    scheduler = scheduler_with([a, b], budget=64)
    a.spec_token_ids, b.spec_token_ids = [9, 9, 9], [4, 4]
    out = scheduler.schedule()
    assert out.num_new_tokens == [4, 3] and out.num_decode_tokens() == 7
    assert out.draft_token_ids == {"a": [9, 9, 9], "b": [4, 4]}
    assert len(scheduler.kv_cache.block_table("a")) * 4 >= a.num_computed_tokens + 4


def test_the_budget_max_tokens_and_max_model_len_trim_proposals():
    a = decoding("a")
    scheduler = scheduler_with([a], budget=20)
    scheduler.limits.max_num_batched_tokens = 3
    a.spec_token_ids = [9, 9, 9, 9]
    assert scheduler.schedule().num_new_tokens == [3]  # two proposals fit the budget of three
    short = decoding("s", max_tokens=3)
    scheduler = scheduler_with([short], budget=20)
    short.spec_token_ids = [9, 9, 9, 9]
    assert scheduler.schedule().num_new_tokens == [2]  # one output so far: two more at most, one proposal
    long = decoding("l")
    scheduler = scheduler_with([long], budget=20, max_model_len=11)
    long.spec_token_ids = [9, 9, 9, 9]
    assert scheduler.schedule().num_new_tokens == [2]  # 9 tokens of 11: one proposal and the token after it


def test_preemption_drops_proposals():
    a = decoding("a")
    scheduler = scheduler_with([a], budget=20)
    a.spec_token_ids = [9, 9]
    scheduler._preempt(a, scheduler.schedule())
    assert a.spec_token_ids == [] and a.num_computed_tokens == 0
