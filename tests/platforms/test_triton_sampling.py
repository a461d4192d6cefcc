"""The counter-keyed draw (platforms/triton_ops/sampling.py), through Triton's interpreter on CPU: each row's
token depends on its own probabilities and (seed, counter) alone, follows the probabilities' law, and the sampler
that uses it (as the CUDA platform's does) gives a seeded request the same tokens whatever its batch."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from folovllm import SamplingParams
from folovllm.sample.metadata import build_sampling_batch
from folovllm.sample.rows import SamplingRow
from folovllm.sample.sampler import Sampler
from tests.helpers import use_triton_interpreter_without_cuda

if importlib.util.find_spec("triton") is None:  # not importorskip: triton must not be imported yet
    pytest.skip("triton is not installed (the test extra pins it on x86-64 Linux)", allow_module_level=True)
use_triton_interpreter_without_cuda()

from folovllm.platforms.triton_ops.sampling import CHUNK, exponential_race  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_a_rows_token_depends_on_its_own_key_alone() -> None:
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4, CHUNK + 700, generator=gen), dim=-1).to(DEVICE)  # two chunks a row
    probs[2] = probs[0]
    seeds, counters = torch.tensor([5, -3, 5, 2**62], device=DEVICE), torch.tensor([0, 9, 0, 1], device=DEVICE)
    together = exponential_race(probs, seeds, counters)
    alone = torch.cat([exponential_race(probs[i:i + 1], seeds[i:i + 1], counters[i:i + 1]) for i in range(4)])
    assert torch.equal(together, alone)
    assert together[0] == together[2]  # the same probabilities and key: the same token
    assert not torch.equal(exponential_race(probs, seeds, counters + 1), together)  # the next draw differs


def test_draws_follow_the_probabilities() -> None:
    probs = torch.tensor([0.1, 0.2, 0.0, 0.7], device=DEVICE).expand(300, 4).contiguous()
    tokens = exponential_race(probs, torch.full((300,), 11, device=DEVICE), torch.arange(300, device=DEVICE))
    freq = torch.bincount(tokens.cpu(), minlength=4).double() / 300
    assert freq[2] == 0  # a token of probability zero is never drawn
    expected = torch.tensor([0.1, 0.2, 0.0, 0.7], dtype=torch.float64)
    torch.testing.assert_close(freq, expected, atol=0.08, rtol=0)  # 3 sigma at 300 draws


def test_a_seeded_request_samples_the_same_tokens_in_any_batch() -> None:
    sampler = Sampler(race=exponential_race)
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 300, generator=gen).to(DEVICE)
    seeded = SamplingRow(SamplingParams(temperature=0.9, top_p=0.95, seed=1234), seed=1234, num_output_tokens=6)
    others = [SamplingRow(SamplingParams(temperature=1.0)), SamplingRow(SamplingParams(temperature=0.0))]
    rows = [others[0], seeded, others[1]]
    batch = build_sampling_batch(rows, [None] * 3, 300, DEVICE, noise_step_seed=77)
    in_batch, _ = sampler.sample(logits, batch)
    alone = build_sampling_batch([seeded], [None], 300, DEVICE, noise_step_seed=5)
    token, _ = sampler.sample(logits[1:2], alone)
    assert in_batch[1] == token[0]
    assert in_batch[2] == logits[2].argmax()  # a greedy row in a sampled batch takes its argmax
