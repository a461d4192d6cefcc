"""The rejection sampler keeps the target distribution: synthetic probabilities, many seeded draws."""
import pytest
import torch

from folovllm.sample.rejection_sampler import accept_greedy, accept_sampled, verify
from folovllm.sample.rows import SamplingRow
from folovllm.sample.sampler import Sampler
from folovllm.sampling_params import SamplingParams


def test_greedy_keeps_proposals_while_they_match():
    assert accept_greedy([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]
    assert accept_greedy([4, 9, 6, 7], [4, 5, 6]) == [4, 9]
    assert accept_greedy([3], []) == [3]


def _chi_square_p(samples: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double()
    expected = probs.double() * len(samples)
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was emitted"
    statistic = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    degrees = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2.0), statistic / 2.0))  # chi-square survival


def test_chi_square_rejects_a_wrong_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    assert _chi_square_p([0] * 400 + [1] * 400 + [2] * 200, probs) < 1e-6
    assert _chi_square_p([0] * 500 + [1] * 300 + [2] * 200, probs) > 0.99


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_first_token_and_second_keep_the_target_distribution(with_draft_probs):
    generator = torch.Generator().manual_seed(0)
    vocab = 6
    target = torch.softmax(torch.randn(3, vocab, generator=generator) * 1.5, dim=-1)
    target[0, 4] = 0.0  # a token the target never emits
    target[0] /= target[0].sum()
    draft_q = torch.softmax(torch.randn(2, vocab, generator=generator), dim=-1)
    first, second = [], []
    for _ in range(8000):
        if with_draft_probs:  # a draft model's proposals, drawn from its own distribution
            drafts = [int(torch.multinomial(draft_q[j], 1, generator=generator)) for j in range(2)]
            tokens = accept_sampled(target, drafts, generator, draft_q)
        else:  # n-gram lookup's fixed proposals, including the token the target never emits
            tokens = accept_sampled(target, [4, 1], generator)
        first.append(tokens[0])
        if len(tokens) > 1 and tokens[0] == (drafts[0] if with_draft_probs else 4):
            second.append(tokens[1])
    assert _chi_square_p(first, target[0]) > 1e-3
    if with_draft_probs:  # the token after a kept first proposal follows the second row
        assert _chi_square_p(second, target[1]) > 1e-3


def test_seeded_requests_are_reproducible():
    probs = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(1)), dim=-1)
    runs = [[accept_sampled(probs, [3, 7, 9], generator) for _ in range(20)]
            for generator in (torch.Generator().manual_seed(42), torch.Generator().manual_seed(42))]
    assert runs[0] == runs[1]
    assert len({tuple(tokens) for tokens in runs[0]}) > 1


def test_verify_mixes_greedy_and_random_rows_and_reports_logprobs():
    logits = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    greedy = SamplingRow(SamplingParams(temperature=0.0, logprobs=2), num_output_tokens=1)
    random = SamplingRow(SamplingParams(temperature=0.8, seed=5), seed=5, num_output_tokens=1)
    target = logits[:3].argmax(dim=-1).tolist()
    drafts = [[target[0], (target[1] + 1) % 32], [1]]
    emitted, logprobs = verify(logits, [greedy] * 3 + [random] * 2, drafts,
                               [None, torch.Generator().manual_seed(5)], Sampler())
    assert emitted[0] == [target[0], target[1]]
    assert 1 <= len(emitted[1]) <= 2
    assert [lp.token_id for lp in logprobs[0]] == emitted[0]
    expected = torch.log_softmax(logits[1], dim=-1)[target[1]].item()
    assert logprobs[0][1].logprob == pytest.approx(expected, abs=1e-5)
    assert logprobs[1] == [None] * len(emitted[1])
