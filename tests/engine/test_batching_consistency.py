"""Greedy output must not depend on batch company, chunk sizes or preemption."""
import pytest

from folovllm import SamplingParams
from tests.engine.conftest import make_llm, random_prompts
from tests.tolerance import assert_greedy_match, logprob_gaps

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)


def run(llm, prompts, params=GREEDY):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def assert_same(candidates, references):
    for ours, ref in zip(candidates, references):
        assert_greedy_match(ours.token_ids, ref.token_ids, logprob_gaps(ref))


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(6, seed=1)


@pytest.fixture(scope="module")
def alone(tiny_llama_dir, prompts):
    llm = make_llm(tiny_llama_dir)
    return [run(llm, [p])[0] for p in prompts]


def test_batch_equals_alone(tiny_llama_dir, prompts, alone):
    assert_same(run(make_llm(tiny_llama_dir), prompts), alone)


@pytest.mark.parametrize("chunk", [3, 5, 16])  # 3 and 5 cut the 4-token blocks
def test_chunked_prefill_equals_alone(tiny_llama_dir, prompts, alone, chunk):
    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=chunk)
    assert_same(run(llm, prompts), alone)


def test_no_chunked_prefill_equals_alone(tiny_llama_dir, prompts, alone):
    llm = make_llm(tiny_llama_dir, enable_chunked_prefill=False, max_num_batched_tokens=8)
    assert_same(run(llm, prompts), alone)


def test_preempted_requests_recompute_to_the_same_output(tiny_llama_dir, prompts, alone):
    # 32 blocks of 4 = 128 slots < what 6 requests of up to 64 tokens need at once.
    llm = make_llm(tiny_llama_dir, num_gpu_blocks_override=32, max_model_len=128)
    outs = run(llm, prompts)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert_same(outs, alone)
    assert llm.llm_engine.kv_cache.num_free_blocks == 32


@pytest.mark.parametrize("engine_args", [
    dict(scheduling_policy="priority"),
    dict(scheduling_policy="sjf", max_queue_delay=0.5),
    dict(scheduling_policy="fair"),
    dict(admission="reserve", max_num_batched_tokens=64),
    dict(admission="adaptive", num_gpu_blocks_override=40, max_model_len=128),
    dict(scheduling="static"),
    dict(kv_layout="contiguous"),
    dict(long_prefill_token_threshold=5, max_num_batched_tokens=16),
], ids=["priority", "sjf", "fair", "reserve", "adaptive", "static", "contiguous", "prefill-threshold"])
def test_policies_and_admission_modes_do_not_change_outputs(tiny_llama_dir, prompts, alone, engine_args):
    llm = make_llm(tiny_llama_dir, **{"max_num_seqs": 3, **engine_args})
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False,
                        priority=[i % 3 for i in range(len(prompts))],
                        user=[f"tenant{i % 2}" for i in range(len(prompts))])
    assert_same([o.outputs[0] for o in outs], alone)


def test_step_trace_records_every_step(tiny_llama_dir, prompts, tmp_path):
    trace = tmp_path / "trace.jsonl"
    llm = make_llm(tiny_llama_dir, trace_path=str(trace), max_num_batched_tokens=16)
    run(llm, prompts)
    import json

    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == llm.llm_engine.stats.num_steps
    assert all(r["num_prefill_tokens"] + r["num_decode_tokens"] <= 16 for r in records)
    assert sum(r["num_prefill_tokens"] for r in records) >= sum(len(p) for p in prompts)
    assert records[-1]["num_running"] == 0 and max(r["num_running"] for r in records) > 1
