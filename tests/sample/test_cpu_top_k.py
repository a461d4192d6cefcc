"""The CPU kernel's top k of each row (``torch.ops.folovllm.top_k_rows``) against a stable descending sort (the
lower id first among equal logits), and its sampling among them (``sample_top_k``) against the sampler's torch
form (the ``FOLOVLLM_CPU_TOP_K_KERNEL`` switch), at every tier the host has."""
from __future__ import annotations

import pytest
import torch

from folovllm import SamplingParams
from folovllm.platforms import kernel_library
from folovllm.sample.sampler import Sampler
from tests.sample.test_sampler import make_batch
from tests.tiers import skip_unless_kernel


@pytest.fixture(autouse=True)
def every_tier(kernel_tier: str) -> None:
    skip_unless_kernel("top_k")


def stable_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ordered = logits.sort(dim=-1, descending=True, stable=True)
    return ordered.values[:, :k], ordered.indices[:, :k]


@pytest.mark.parametrize("vocab,k", [(1, 1), (7, 3), (50, 50), (512, 50), (1000, 1), (1000, 300), (40_000, 50),
                                     (49_153, 20)])
def test_top_k_rows_match_a_stable_sort(vocab: int, k: int) -> None:
    # rows that rise along the vocabulary raise the threshold many times; a falling row never does
    gen = torch.Generator().manual_seed(vocab + k)
    logits = torch.cat([torch.randn(5, vocab, generator=gen),
                        torch.linspace(-3, 3, vocab).unsqueeze(0), torch.linspace(3, -3, vocab).unsqueeze(0)])
    values, ids = torch.ops.folovllm.top_k_rows(logits, k)
    expected_values, expected_ids = stable_top_k(logits, k)
    assert torch.equal(values, expected_values) and torch.equal(ids, expected_ids)


@pytest.mark.parametrize("levels", [1, 3, 40])
def test_equal_logits_keep_the_lower_ids(levels: int) -> None:
    gen = torch.Generator().manual_seed(levels)
    logits = torch.randint(0, levels, (6, 3000), generator=gen).float()
    logits[0, :100] = float("-inf")
    logits[1] = float("-inf")  # every logit equal: the first k ids
    values, ids = torch.ops.folovllm.top_k_rows(logits, 64)
    expected_values, expected_ids = stable_top_k(logits, 64)
    assert torch.equal(values, expected_values) and torch.equal(ids, expected_ids)


def test_top_k_rows_refuses_what_it_does_not_take() -> None:
    with pytest.raises(RuntimeError, match="k must be in"):
        torch.ops.folovllm.top_k_rows(torch.zeros(2, 5), 6)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.folovllm.top_k_rows(torch.zeros(2, 5, dtype=torch.bfloat16), 2)


ROWS = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=1),
        SamplingParams(temperature=1.2, top_k=20, seed=2),
        SamplingParams(temperature=0.7, top_k=40, min_p=0.05, seed=3),
        SamplingParams(temperature=0.6, top_k=30, top_p=0.5, min_p=0.2, seed=4),
        SamplingParams(temperature=0.0)]


@pytest.mark.parametrize("vocab", [300, 6000])  # the small and the large vocabulary's selection
@pytest.mark.parametrize("rows", [ROWS, ROWS[:3], [ROWS[4], SamplingParams(temperature=0.9, top_k=9, top_p=0.95),
                                                  SamplingParams(temperature=1.0, top_k=40, seed=5)]])
def test_the_kernel_samples_the_torch_forms_tokens(vocab: int, rows: list[SamplingParams]) -> None:
    """Seeded rows, unseeded ones (the same global draws), top-p, min-p and a greedy row, over many steps: the
    kernel's tokens are the candidate path's torch form's (no equal logits here, where the orders could differ)."""
    kernel, torch_form = Sampler(top_k_candidates=True, candidate_kernel=torch.ops.folovllm.sample_top_k.default), \
        Sampler(top_k_candidates=True)
    gen = torch.Generator().manual_seed(vocab)
    tokens = set()
    for step in range(40):
        logits = torch.randn(len(rows), vocab, generator=gen) * 3
        batch = make_batch(rows, vocab, output_count=step + 1)
        torch.manual_seed(step)
        ours = kernel(logits, batch).sampled_token_ids
        torch.manual_seed(step)
        assert ours == torch_form(logits, batch).sampled_token_ids
        tokens.update(ours)
    assert len(tokens) > 20  # the rows sampled, not only their argmax


def test_the_kernel_refuses_rows_without_noise() -> None:
    logits, ones = torch.randn(2, 100), torch.ones(2)
    with pytest.raises(RuntimeError, match="need noise"):
        torch.ops.folovllm.sample_top_k(logits, 5, ones, torch.full((2,), 5), None, None, None, None, None, None)
    with pytest.raises(RuntimeError, match="come together"):
        torch.ops.folovllm.sample_top_k(logits, 5, ones, torch.full((2,), 5), None, None, torch.ones(2, dtype=torch.long),
                                        None, None, torch.ones(2, 5))


def test_the_switch_decides_the_platforms_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    from folovllm.platforms.cpu import CpuPlatform

    assert CpuPlatform(torch.device("cpu")).candidate_sampler() is torch.ops.folovllm.sample_top_k.default
    monkeypatch.setenv("FOLOVLLM_CPU_TOP_K_KERNEL", "off")
    assert CpuPlatform(torch.device("cpu")).candidate_sampler() is None
    assert kernel_library.has_kernel("top_k")
