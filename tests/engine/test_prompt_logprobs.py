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
