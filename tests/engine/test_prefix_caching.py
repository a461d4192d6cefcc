"""Prefix caching changes what is computed, never what is generated."""
import pytest

from folovllm import SamplingParams
from tests.engine.conftest import make_llm, random_prompts
from tests.tolerance import assert_greedy_match, logprob_gaps

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
BLOCK = 4


def run(llm, prompts, **kwargs):
    return llm.generate([{"prompt_token_ids": p, **kwargs} for p in prompts], PARAMS, use_tqdm=False)


@pytest.fixture(scope="module")
def cached_llm(tiny_llama_dir):
    return make_llm(tiny_llama_dir, block_size=BLOCK)


@pytest.fixture(scope="module")
def plain_llm(tiny_llama_dir):
    return make_llm(tiny_llama_dir, block_size=BLOCK, enable_prefix_caching=False)


@pytest.mark.parametrize("shared_len", [4 * BLOCK, 4 * BLOCK - 1, 4 * BLOCK + 1])
def test_shared_prefix_outputs_equal_without_cache(cached_llm, plain_llm, shared_len):
    cached_llm.reset_prefix_cache()
    prefix = random_prompts(1, seed=shared_len, low=shared_len, high=shared_len + 1)[0]
    tails = random_prompts(3, seed=100 + shared_len, low=2, high=7)
    prompts = [prefix + t for t in tails]
    reference = run(plain_llm, prompts)
    first = run(cached_llm, prompts[:1])  # warms the cache with the shared prefix
    rest = run(cached_llm, prompts[1:])
    for ours, ref in zip(first + rest, reference):
        assert_greedy_match(ours.outputs[0].token_ids, ref.outputs[0].token_ids, logprob_gaps(ref.outputs[0]))
    full_blocks = shared_len // BLOCK
    assert all(o.num_cached_tokens == full_blocks * BLOCK for o in rest)
    assert first[0].num_cached_tokens == 0


def test_identical_prompts_hit_all_but_the_last_token(cached_llm, plain_llm):
    cached_llm.reset_prefix_cache()
    prompt = random_prompts(1, seed=7, low=16, high=17)[0]  # exactly 4 blocks
    reference = run(plain_llm, [prompt])[0].outputs[0]
    run(cached_llm, [prompt])
    again = run(cached_llm, [prompt, prompt])
    for out in again:
        assert out.num_cached_tokens == 12  # the block holding the last prompt token is recomputed
        assert_greedy_match(out.outputs[0].token_ids, reference.token_ids, logprob_gaps(reference))


def test_cache_salt_prevents_sharing(cached_llm):
    cached_llm.reset_prefix_cache()
    prompt = random_prompts(1, seed=8, low=20, high=21)[0]
    run(cached_llm, [prompt], cache_salt="tenant-a")
    assert run(cached_llm, [prompt], cache_salt="tenant-b")[0].num_cached_tokens == 0
    assert run(cached_llm, [prompt], cache_salt="tenant-a")[0].num_cached_tokens == 16


def test_eviction_under_pressure_still_serves_correctly(tiny_llama_dir, plain_llm):
    # 40 blocks of 4 tokens: far too few to keep every prefix cached, so blocks get evicted.
    llm = make_llm(tiny_llama_dir, block_size=BLOCK, num_gpu_blocks_override=40, max_model_len=128)
    prefixes = random_prompts(4, seed=9, low=20, high=30)
    prompts = [prefixes[i % 4] + tail for i, tail in enumerate(random_prompts(12, seed=10, low=1, high=6))]
    reference = run(plain_llm, prompts)
    ours = []
    for i in range(0, 12, 3):  # waves, so later waves meet earlier waves' (partly evicted) blocks
        ours += run(llm, prompts[i:i + 3])
    for out, ref in zip(ours, reference):
        assert_greedy_match(out.outputs[0].token_ids, ref.outputs[0].token_ids, logprob_gaps(ref.outputs[0]))
    engine = llm.llm_engine
    assert engine.stats.prefix_cache_hits > 0
    assert engine.kv_cache.num_used_blocks == 0 and engine.kv_cache.num_free_blocks == 40


def test_preempted_request_rehits_its_own_blocks(tiny_llama_dir, plain_llm):
    llm = make_llm(tiny_llama_dir, block_size=BLOCK, num_gpu_blocks_override=32, max_model_len=128)
    prompts = random_prompts(6, seed=1)
    reference = run(plain_llm, prompts)
    ours = run(llm, prompts)
    engine = llm.llm_engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats.prefix_cache_hits > 0  # recomputation found its own blocks still cached
    for out, ref in zip(ours, reference):
        assert_greedy_match(out.outputs[0].token_ids, ref.outputs[0].token_ids, logprob_gaps(ref.outputs[0]))


def test_hit_rate_stats(cached_llm):
    cached_llm.reset_prefix_cache()
    engine = cached_llm.llm_engine
    queries, hits = engine.kv_cache.prefix_cache_queries, engine.kv_cache.prefix_cache_hits
    prompt = random_prompts(1, seed=11, low=24, high=25)[0]
    run(cached_llm, [prompt])
    run(cached_llm, [prompt])
    assert engine.kv_cache.prefix_cache_queries - queries == 48
    assert engine.kv_cache.prefix_cache_hits - hits == 20
    assert 0 < engine.stats.prefix_cache_hit_rate <= 1
