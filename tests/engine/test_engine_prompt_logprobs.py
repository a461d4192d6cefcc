"""Prompt logprobs (SamplingParams.prompt_logprobs) equal transformers' log_softmax of the same prompt,
whatever the chunking, prefix caching, preemption or batch around them."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from folovllm import SamplingParams
from tests.engine.conftest import make_llm, random_prompts

ATOL = 1e-4


@pytest.fixture(scope="module")
def hf_logprobs(tiny_llama_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()

    def reference(prompt: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([prompt])).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)  # row j predicts token j + 1

    return reference


def check(output, reference, k: int) -> None:
    """Each entry: the actual token's logprob and rank, and the top-k in rank order, as transformers
    has them (ranks and order up to float near-ties)."""
    prompt = output.prompt_token_ids
    entries = output.prompt_logprobs
    assert entries is not None and len(entries) == len(prompt)
    assert entries[0] is None
    ref = reference(prompt)
    for pos in range(1, len(prompt)):
        row, token, entry = ref[pos - 1], prompt[pos], entries[pos]
        actual = entry[token]
        assert actual.logprob == pytest.approx(float(row[token]), abs=ATOL)
        lowest = int((row > row[token] + ATOL).sum()) + 1
        highest = int((row > row[token] - ATOL).sum()) + 1
        assert lowest <= actual.rank <= highest
        top = sorted((lp.rank, lp.logprob, t) for t, lp in entry.items() if lp.rank <= k and
                     not (t == token and actual.rank > k))
        assert [rank for rank, _, _ in top] == list(range(1, k + 1))
        values = [value for _, value, _ in top]
        assert values == pytest.approx(row.topk(k).values.tolist(), abs=ATOL)
        for _, value, tid in top:
            assert value == pytest.approx(float(row[tid]), abs=ATOL)
        assert len(entry) == k + (actual.rank > k)


@pytest.mark.parametrize("k", [0, 3])
def test_prompt_logprobs_match_transformers_over_several_chunks(tiny_llama_dir, hf_logprobs, k):
    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=16)
    prompts = random_prompts(3, seed=1, low=30, high=60)  # every prompt spans several chunks
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=k),
                           use_tqdm=False)
    for output in outputs:
        check(output, hf_logprobs, k)


def test_prefix_caching_does_not_hide_prompt_tokens(tiny_llama_dir, hf_logprobs):
    llm = make_llm(tiny_llama_dir, enable_prefix_caching=True, max_num_batched_tokens=16)
    prompt = random_prompts(1, seed=2, low=40, high=41)[0]
    plain = SamplingParams(temperature=0, max_tokens=2)
    scored = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    assert llm.generate([prompt], plain, use_tqdm=False)[0].prompt_logprobs is None
    again = llm.generate([prompt], scored, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0  # the cached prefix was skipped: every token was computed
    check(again, hf_logprobs, 1)
    twice = llm.generate([prompt], scored, use_tqdm=False)[0]
    check(twice, hf_logprobs, 1)
    assert llm.generate([prompt], plain, use_tqdm=False)[0].num_cached_tokens > 0  # blocks stay shared


def test_mixed_batch_keeps_other_requests_unchanged(tiny_llama_dir, hf_logprobs):
    prompts = random_prompts(6, seed=3, low=10, high=40)
    plain = SamplingParams(temperature=0, max_tokens=8)
    alone = make_llm(tiny_llama_dir).generate(prompts, plain, use_tqdm=False)
    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=24)
    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=2) if i % 2 else plain
        engine.add_request(prompt, params, request_id=str(i))
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            assert (output.prompt_logprobs is not None) == (int(output.request_id) % 2 == 1)
            finals[output.request_id] = output
    for i, ref in enumerate(alone):
        out = finals[str(i)]
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        if i % 2:
            check(out, hf_logprobs, 2)


def test_preemption_recomputes_without_duplicates(tiny_llama_dir, hf_logprobs):
    # 32 blocks of 4 = 128 slots < what 6 requests of up to 64 tokens need at once.
    llm = make_llm(tiny_llama_dir, num_gpu_blocks_override=32, max_model_len=128, max_num_batched_tokens=16)
    prompts = random_prompts(6, seed=4, low=20, high=40)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                   prompt_logprobs=0), use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for output in outputs:
        check(output, hf_logprobs, 0)


def test_samples_share_one_set_and_a_one_token_prompt_has_none(tiny_llama_dir, hf_logprobs):
    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=16)
    prompt = random_prompts(1, seed=5, low=30, high=31)[0]
    [out] = llm.generate([prompt], SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=4,
                                                  prompt_logprobs=1), use_tqdm=False)
    assert len(out.outputs) == 3
    check(out, hf_logprobs, 1)
    [single] = llm.generate([[7]], SamplingParams(max_tokens=2, prompt_logprobs=1), use_tqdm=False)
    assert single.prompt_logprobs == [None]


def test_overlap_scheduling_gives_the_same_prompt_logprobs(tiny_llama_dir, hf_logprobs):
    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=16, overlap_scheduling=True)
    prompts = random_prompts(3, seed=6, low=20, high=50)
    for output in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=3),
                               use_tqdm=False):
        check(output, hf_logprobs, 3)
