"""The feature matrix, what a request asks of sampling: prompt logprobs against transformers' log-softmax,
presence/frequency/repetition penalties against transformers' logits penalized as vLLM does, and beam search
against a brute-force search over transformers' logprobs, each on the same device. CPU twins here; CUDA cases
in the GPU check."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from folovllm import BeamSearchParams, TokensPrompt
from tests.engine.test_engine_prompt_logprobs import check
from tests.entrypoints.test_llm_vllm_api import reference_beam_search
from tests.matrix.engines import DEVICES, engine, greedy, hf_model, token_prompts
from tests.tolerance import assert_greedy_match, top2_gaps

VOCAB = 512
PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3)


@pytest.mark.parametrize("device", DEVICES)
def test_prompt_logprobs_equal_transformers(llama_dir: str, device: str) -> None:
    model = hf_model(llama_dir, device)

    def reference(prompt: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([prompt], device=device)).logits[0]
        return torch.log_softmax(logits.float(), dim=-1).cpu()  # row j predicts token j + 1

    llm = engine(llama_dir, device, max_num_batched_tokens=16)  # every prompt spans several chunks
    prompts = token_prompts(2, seed=8, low=30, high=50, vocab=VOCAB)
    for output in llm.generate(prompts, greedy(2, prompt_logprobs=3), use_tqdm=False):
        check(output, reference, 3)


def penalized_greedy(model, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy over transformers' logits with vLLM's penalties: repetition on every token seen (prompt and
    output), then frequency per occurrence and presence once, on output tokens."""
    tokens, output, gaps = list(prompt), [], []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(torch.tensor([tokens], device=model.device)).logits[0, -1].float().cpu()
            seen = torch.tensor(sorted(set(tokens)))
            logits[seen] = torch.where(logits[seen] > 0, logits[seen] / PENALTIES["repetition_penalty"],
                                       logits[seen] * PENALTIES["repetition_penalty"])
            for token, count in Counter(output).items():
                logits[token] -= PENALTIES["frequency_penalty"] * count + PENALTIES["presence_penalty"]
            gaps += top2_gaps([logits])
            output.append(int(logits.argmax()))
            tokens.append(output[-1])
    return output, gaps


@pytest.mark.parametrize("device", DEVICES)
def test_penalties_equal_transformers_logits_penalized(llama_dir: str, device: str) -> None:
    model = hf_model(llama_dir, device)
    prompts = token_prompts(3, seed=9, low=4, high=30, vocab=VOCAB)
    outs = engine(llama_dir, device).generate([{"prompt_token_ids": p} for p in prompts],
                                              greedy(12, **PENALTIES), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert_greedy_match(out.outputs[0].token_ids, *penalized_greedy(model, prompt, 12))


@pytest.mark.parametrize("device", DEVICES)
def test_beam_search_equals_brute_force(wide_llama_dir: str, device: str) -> None:
    model = hf_model(wide_llama_dir, device)
    llm = engine(wide_llama_dir, device, max_logprobs=6)  # beam width 3 asks for 6
    prompts = token_prompts(2, seed=10, low=4, high=12, vocab=VOCAB)
    outputs = llm.beam_search([TokensPrompt(prompt_token_ids=p) for p in prompts],
                              BeamSearchParams(beam_width=3, max_tokens=3, ignore_eos=True))
    for prompt, output in zip(prompts, outputs):
        expected = reference_beam_search(model, prompt, 3, 3)
        assert [s.tokens for s in output.sequences] == [tokens for tokens, _ in expected]
        for seq, (_, score) in zip(output.sequences, expected):
            assert seq.cum_logprob == pytest.approx(score, abs=1e-3)
