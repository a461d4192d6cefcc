"""Sampler behaviour: greedy, filters, seeded determinism, logits processors (penalties, banned ids),
logprobs; its shortcuts against the general path."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.sample.metadata import SamplingBatch, SamplingRow, build_sampling_batch
from folovllm.sample.sampler import (
    Sampler,
    _apply_min_p,
    _apply_top_k_only,
    _apply_top_k_top_p,
    _exponential_race,
)
from folovllm.sampling_params import SamplingParams


def make_batch(
    params: list[SamplingParams],
    vocab_size: int,
    prompts: list[list[int]] | None = None,
    outputs: list[list[int]] | None = None,
    generators: list[torch.Generator | None] | None = None,
    banned: list[list[int]] | None = None,
    output_count: int = 0,
) -> SamplingBatch:
    """``banned[i]``: row i's stop ids, with min_tokens still ahead (so the sampler must avoid them);
    ``output_count``: every row's tokens so far."""
    n = len(params)
    rows = []
    for i, p in enumerate(params):
        stop = tuple(banned[i]) if banned else ()
        if stop:
            p = dataclasses.replace(p, min_tokens=1)
        rows.append(SamplingRow(p, p.seed, output_count, stop, prompts[i] if prompts else (),
                                outputs[i] if outputs else ()))
    return build_sampling_batch(rows, generators or [None] * n, vocab_size, "cpu")


def full_sort_sample(logits: torch.Tensor, batch: SamplingBatch) -> list[int]:
    """Reference: the sampler's general path with no shortcut (every top-k through the full sort)."""
    logits = logits.to(torch.float32, copy=True)
    for processor in batch.processors:
        processor.apply(logits)
    greedy = logits.argmax(dim=-1)
    if batch.all_greedy:
        return greedy.tolist()
    logits.div_(batch.temperature.unsqueeze(1))
    if batch.top_k is not None or batch.top_p is not None:
        _apply_top_k_top_p(logits, batch.top_k, batch.top_p)
    if batch.min_p is not None:
        _apply_min_p(logits, batch.min_p)
    sampled = _exponential_race(logits.softmax(dim=-1), batch.generators)
    if batch.greedy_mask is not None:
        sampled = torch.where(batch.greedy_mask, greedy, sampled)
    return sampled.tolist()


def sample(logits: torch.Tensor, params: list[SamplingParams], candidates: bool = False, output_count: int = 0,
           **kwargs) -> list[int]:
    """``output_count``: every row's (seeded rows' candidate noise is hashed from it)."""
    batch = make_batch(params, logits.shape[1], output_count=output_count, **kwargs)
    return Sampler(top_k_candidates=candidates)(logits, batch).sampled_token_ids


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_is_argmax() -> None:
    logits = torch.randn(8, 1000, generator=seeded(0))
    batch = make_batch([SamplingParams(temperature=0.0)] * 8, 1000)
    assert batch.is_plain_greedy
    out = Sampler()(logits, batch)
    assert out.sampled_token_ids == logits.argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 8
    assert full_sort_sample(logits, batch) == logits.argmax(dim=-1).tolist()


def test_sampler_does_not_modify_logits() -> None:
    logits = torch.randn(3, 50, generator=seeded(1))
    before = logits.clone()
    params = [SamplingParams(temperature=0.7, top_k=5, top_p=0.8, min_p=0.1, repetition_penalty=1.5)] * 3
    sample(logits, params, outputs=[[1, 2], [3], []], banned=[[0], [], [4]])
    assert torch.equal(logits, before)


def test_top_k_one_equals_greedy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(16, 500, generator=seeded(2))
    assert sample(logits, [SamplingParams(temperature=1.5, top_k=1)] * 16) == logits.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(16, 500, generator=seeded(3))
    assert sample(logits, [SamplingParams(temperature=1.0, top_p=1e-6)] * 16) == logits.argmax(-1).tolist()


def test_min_p_drops_unlikely_tokens() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(2000, 4)
    # Threshold 0.5 * 0.5 = 0.25: only tokens 0 and 1 survive.
    tokens = sample(logits, [SamplingParams(min_p=0.5)] * 2000)
    assert set(tokens) == {0, 1}


def test_temperature_changes_distribution() -> None:
    torch.manual_seed(1234)
    n = 4000
    logits = torch.tensor([[1.0, 0.0, -1.0]]).expand(n, 3)
    for temperature in (0.5, 2.0):
        tokens = torch.tensor(sample(logits, [SamplingParams(temperature=temperature)] * n))
        freq = torch.bincount(tokens, minlength=3).float() / n
        expected = torch.softmax(logits[0] / temperature, dim=-1)
        assert torch.allclose(freq, expected, atol=0.03), (temperature, freq, expected)


@pytest.mark.parametrize("candidates", [False, True])
def test_seeded_row_ignores_rest_of_batch(candidates: bool) -> None:
    vocab, steps = 300, 12
    step_logits = [torch.randn(4, vocab, generator=seeded(s)) for s in range(steps)]
    mine = SamplingParams(temperature=0.9, top_k=40, seed=7)  # top-k only: topk path when alone
    others = [
        SamplingParams(temperature=1.0, top_p=0.9),  # forces the sort path for the whole batch
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=1.2, seed=99, min_p=0.05, repetition_penalty=1.3),
    ]

    gen = seeded(7)
    alone = [sample(logits[:1], [mine], candidates, step, generators=[gen])[0]
             for step, logits in enumerate(step_logits)]

    for position in range(4):
        torch.manual_seed(position)  # the unseeded neighbours draw differently each run
        gen = seeded(7)
        other_gen = seeded(99)
        got = []
        for step, logits in enumerate(step_logits):
            rows = [logits[1], logits[2], logits[3]]
            rows.insert(position, logits[0])
            params = list(others)
            params.insert(position, mine)
            gens: list[torch.Generator | None] = [None, None, other_gen]
            gens.insert(position, gen)
            outputs = [[5, 6]] * 4
            got.append(sample(torch.stack(rows), params, candidates, step, generators=gens,
                              outputs=outputs)[position])
        assert got == alone, position


def test_repetition_penalty_changes_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    assert sample(logits, [SamplingParams(temperature=0.0)], outputs=[[0]]) == [0]
    assert sample(logits, [SamplingParams(temperature=0.0, repetition_penalty=2.0)], outputs=[[0]]) == [1]
    assert sample(logits, [SamplingParams(temperature=0.0, presence_penalty=1.5)], outputs=[[0]]) == [1]


def test_banned_ids_never_sampled() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0]]).expand(500, 4)
    params = [SamplingParams(temperature=0.0)] + [SamplingParams(temperature=2.0)] * 499
    tokens = sample(logits, params, banned=[[0, 1]] * 500)
    assert tokens[0] == 2
    assert set(tokens) == {2, 3}


def test_logprobs_from_raw_logits() -> None:
    logits = torch.randn(3, 100, generator=seeded(5))
    params = [
        SamplingParams(temperature=0.5, logprobs=5, repetition_penalty=1.7),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=0),
    ]
    out = Sampler()(logits, make_batch(params, 100, outputs=[[1, 2, 3], [], []], banned=[[], [], [7]]))
    raw = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[1] is None
    for row, n in ((0, 5), (2, 0)):
        lp = out.logprobs[row]
        token = out.sampled_token_ids[row]
        assert lp is not None and lp.token_id == token
        assert lp.logprob == pytest.approx(raw[row, token].item(), abs=1e-6)
        assert lp.rank == 1 + int((raw[row] > raw[row, token]).sum())
        values, ids = raw[row].topk(n)
        assert [t for t, _ in lp.top_logprobs] == ids.tolist()
        assert [v for _, v in lp.top_logprobs] == pytest.approx(values.tolist(), abs=1e-6)
        assert [v for _, v in lp.top_logprobs] == sorted((v for _, v in lp.top_logprobs), reverse=True)


def test_logprobs_rank_of_greedy_token_is_one() -> None:
    logits = torch.randn(2, 50, generator=seeded(6))
    out = Sampler()(logits, make_batch([SamplingParams(temperature=0.0, logprobs=3)] * 2, 50))
    assert [lp.rank for lp in out.logprobs] == [1, 1]
    assert [lp.top_logprobs[0][0] for lp in out.logprobs] == out.sampled_token_ids


@pytest.mark.parametrize(
    "params",
    [
        [SamplingParams(temperature=0.0)] * 4,
        [SamplingParams(temperature=0.8, top_k=10, seed=i) for i in range(4)],
        [SamplingParams(temperature=0.8, top_k=3, top_p=0.9), SamplingParams(temperature=0.0)] * 2,
    ],
)
def test_fast_paths_do_not_change_output(params: list[SamplingParams]) -> None:
    logits = torch.randn(4, 400, generator=seeded(8))
    results = []
    for sampler in (Sampler().forward, full_sort_sample):
        torch.manual_seed(0)
        gens = [seeded(p.seed) if p.seed is not None else None for p in params]
        out = sampler(logits, make_batch(params, 400, generators=gens))
        results.append(out if isinstance(out, list) else out.sampled_token_ids)
    assert results[0] == results[1]


def test_top_k_without_sort_equals_the_full_sort() -> None:
    logits = torch.randn(6, 300, generator=seeded(9))
    logits[0, :10] = 1.0  # ties at the threshold
    top_k = torch.tensor([1, 5, 10, 40, 299, 300])
    by_topk, by_sort = logits.clone(), logits.clone()
    _apply_top_k_only(by_topk, top_k, 300)
    _apply_top_k_top_p(by_sort, top_k, None)
    assert torch.equal(by_topk, by_sort)


def test_build_rejects_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="generators"):
        build_sampling_batch([SamplingRow(SamplingParams())] * 2, [None], 10, "cpu")


def test_logits_shape_checked() -> None:
    batch = make_batch([SamplingParams()] * 2, 10)
    with pytest.raises(ValueError, match="num_rows=2"):
        Sampler()(torch.zeros(3, 10), batch)


def allowed_tokens(logits: torch.Tensor, p: SamplingParams, tol: float = 1e-4) -> set[int]:
    """Reference nucleus: top-k, then top-p on what is left, then min-p (float64, slightly generous)."""
    scaled = logits.double() / p.temperature
    order = scaled.argsort(descending=True).tolist()
    k = len(order) if p.top_k == -1 else min(p.top_k, len(order))
    kth = scaled[order[k - 1]]
    kept = [t for t in order if scaled[t] >= kth]
    probs = torch.softmax(scaled[kept], dim=-1).tolist()
    nucleus, mass = [], 0.0
    for t, prob in zip(kept, probs):
        if mass < p.top_p + tol:
            nucleus.append(t)
        mass += prob
    top = scaled[order[0]].item()
    floor = top + math.log(p.min_p) - tol if p.min_p > 0 else -math.inf
    return {t for t in nucleus if scaled[t].item() >= floor}


row_params = st.builds(
    SamplingParams,
    temperature=st.floats(0.05, 3.0),
    top_k=st.one_of(st.just(-1), st.integers(1, 40)),
    top_p=st.floats(0.01, 1.0),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
)


@settings(max_examples=150, deadline=None)
@given(
    params=st.lists(row_params, min_size=1, max_size=4),
    vocab=st.integers(2, 32),
    logits_seed=st.integers(0, 2**31),
    scale=st.floats(0.1, 8.0),
    candidates=st.booleans(),
)
def test_sampled_token_in_allowed_set(params: list[SamplingParams], vocab: int, logits_seed: int, scale: float,
                                      candidates: bool) -> None:
    logits = torch.randn(len(params), vocab, generator=seeded(logits_seed)) * scale
    torch.manual_seed(logits_seed)
    tokens = sample(logits, params, candidates)
    for row, (token, p) in enumerate(zip(tokens, params)):
        assert token in allowed_tokens(logits[row], p), (row, token, p)


def test_top_k_candidates_are_the_random_rows_with_a_top_k() -> None:
    assert make_batch([SamplingParams(top_k=5), SamplingParams(top_k=20), SamplingParams(temperature=0.0)],
                      100).candidate_k == 20  # a greedy row takes its argmax whatever its top_k
    batch = make_batch([SamplingParams(top_k=5), SamplingParams(top_p=0.9)], 100)
    assert batch.candidate_rows == [0] and batch.candidate_k == 5  # the other row takes the full path
    assert make_batch([SamplingParams(top_k=100)], 100).candidate_k is None  # the whole vocabulary


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=6),
    SamplingParams(temperature=1.3, top_k=8, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=10, min_p=0.1),
])
def test_top_k_candidates_sample_the_full_paths_distribution(params: SamplingParams) -> None:
    """Both paths' token frequencies over many draws match the distribution the filters leave (float64)."""
    n, vocab = 6000, 40
    logits = torch.randn(1, vocab, generator=seeded(12)).expand(n, vocab) * 2
    scaled = logits[0].double() / params.temperature
    allowed = sorted(allowed_tokens(logits[0], params, tol=0.0))
    expected = torch.zeros(vocab, dtype=torch.float64)
    expected[allowed] = torch.softmax(scaled[allowed], dim=-1)
    for candidates in (False, True):
        torch.manual_seed(3)
        tokens = torch.tensor(sample(logits, [params] * n, candidates))
        freq = torch.bincount(tokens, minlength=vocab).double() / n
        assert set(tokens.tolist()) <= set(allowed)
        assert torch.allclose(freq, expected, atol=0.025), (candidates, freq, expected)


def test_top_k_candidates_keep_greedy_rows_and_logprobs() -> None:
    logits = torch.randn(4, 200, generator=seeded(13))
    params = [SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=0.9, top_k=4, seed=1),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, top_k=1)]
    batch = make_batch(params, 200, generators=[None, seeded(1), None, None])
    out = Sampler(top_k_candidates=True)(logits, batch)
    argmax = logits.argmax(dim=-1).tolist()
    assert out.sampled_token_ids[0] == argmax[0] and out.sampled_token_ids[2] == argmax[2]
    assert out.sampled_token_ids[3] == argmax[3]  # top_k=1
    assert out.sampled_token_ids[1] in logits[1].topk(4).indices.tolist()
    assert out.logprobs[0].token_id == argmax[0] and out.logprobs[1] is None


def test_top_k_candidates_seeded_row_ignores_a_wider_neighbour() -> None:
    """A neighbour with a larger top k widens every row's candidates: the seeded row's tokens stay the same."""
    mine, wide = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=4), SamplingParams(top_k=50)
    alone, beside = [], []
    gens = (seeded(4), seeded(4))
    for step in range(10):
        logits = torch.randn(2, 300, generator=seeded(100 + step))
        alone.append(sample(logits[:1], [mine], True, step, generators=[gens[0]])[0])
        beside.append(sample(logits, [mine, wide], True, step, generators=[gens[1], None])[0])
    assert alone == beside


def test_top_k_candidates_seeded_noise_needs_output_counts() -> None:
    batch = make_batch([SamplingParams(temperature=1.0, top_k=3, seed=1)], 10, output_count=4)
    assert batch.noise_counters.tolist() == [4] and batch.noise_seeds is None  # no step seed: no race keys
    with pytest.raises(ValueError, match="output counts"):
        Sampler(top_k_candidates=True)(torch.zeros(1, 10), dataclasses.replace(batch, noise_counters=None))


def test_seeded_candidates_noise_is_keyed_by_the_output_count() -> None:
    """The race's key: a seeded row's n-th token depends on its seed and n, not on which step samples it."""
    params = [SamplingParams(temperature=1.5, top_k=40, seed=8)]
    logits = torch.randn(1, 300, generator=seeded(21))
    draws = {n: [sample(logits, params, True, n)[0] for _ in range(2)] for n in range(12)}
    assert all(a == b for a, b in draws.values())
    assert len({a for a, _ in draws.values()}) > 3  # the count moves the noise


def test_a_counter_keyed_race_takes_every_random_row() -> None:
    """Where the platform draws by counter, the top-k candidates path is off and the race gets the rows' keys."""
    calls = []

    def race(probs: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
        calls.append((seeds.tolist(), counters.tolist()))
        return probs.argmax(dim=-1)

    sampler = Sampler(race, top_k_candidates=True)
    assert not sampler.top_k_candidates
    rows = [SamplingRow(SamplingParams(temperature=0.9, top_k=5, seed=7), 7, 3),
            SamplingRow(SamplingParams(temperature=0.9, top_k=5), None, 6)]
    batch = build_sampling_batch(rows, [None, None], 50, "cpu", noise_step_seed=100)
    sampler(torch.randn(2, 50, generator=seeded(2)), batch)
    assert calls == [([7, 101], [3, 6])]


def test_seeded_noise_is_exponential_and_keyed_by_seed_count_and_token() -> None:
    from folovllm.sample.seeded_noise import fold_seed, seeded_exponential

    keys = torch.tensor([fold_seed(s) for s in range(400)])
    ids = torch.arange(500).expand(400, 500)
    noise = seeded_exponential(keys, torch.full((400,), 7), ids)
    assert (noise > 0).all() and abs(noise.mean().item() - 1.0) < 0.01 and abs(noise.var().item() - 1.0) < 0.03
    again = seeded_exponential(keys[:3], torch.full((3,), 7), ids[:3, [4, 2]])  # any candidates, any order
    assert torch.equal(again, noise[:3][:, [4, 2]])
    moved = seeded_exponential(keys[:3], torch.full((3,), 8), ids[:3])
    assert not torch.isclose(moved, noise[:3]).any()
    assert fold_seed(2**70 + 5) == fold_seed(5) and fold_seed(-1) == 0
