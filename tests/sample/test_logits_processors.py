"""Logits processors: exact penalty values, min_tokens banning, token constraints, logit bias, and
the one ordered list."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.sample.logits_processors import (
    LOGITS_PROCESSORS,
    AllowedTokenIdsProcessor,
    BadWordsProcessor,
    GrammarBitmaskProcessor,
    LogitBiasProcessor,
    MinTokensProcessor,
    PenaltiesProcessor,
    adjusts_row,
    build_logits_processors,
)
from folovllm.sample.metadata import (
    SamplingRow,
    build_sampling_batch,
    is_plain_greedy_row,
)
from folovllm.sample.sampler import Sampler
from folovllm.sampling_params import SamplingParams


def test_penalties_exact_values() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5]] * 2)
    rows = [
        SamplingRow(SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
                    prompt_token_ids=[0, 1, 0, 2], output_token_ids=[2, 2, 3]),
        SamplingRow(SamplingParams(), prompt_token_ids=[0, 1], output_token_ids=[2, 2, 3]),
    ]
    # Repeats (0 twice in the prompt, 2 in prompt and output) still get repetition applied once.
    batch = build_sampling_batch(rows, [None, None], 5, "cpu")
    [penalties] = batch.processors
    assert isinstance(penalties, PenaltiesProcessor) and batch.needs_sync
    penalties.apply(logits)
    # 0: prompt, positive -> 2/2. 1: prompt, negative -> -2*2.
    # 2: output twice -> 1/2 - 0.5*2 - 0.25. 3: output once -> -1*2 - 0.5 - 0.25. 4: untouched.
    assert logits[0].tolist() == [1.0, -4.0, -0.75, -2.75, 0.5]
    assert logits[1].tolist() == [2.0, -2.0, 1.0, -1.0, 0.5]


def test_min_tokens_bans_stop_ids_until_reached() -> None:
    params = SamplingParams(temperature=0.0, min_tokens=3)
    short = SamplingRow(params, num_output_tokens=2, stop_token_ids=(0, 1))
    done = SamplingRow(params, num_output_tokens=3, stop_token_ids=(0, 1))
    batch = build_sampling_batch([short, done], [None, None], 4, "cpu")
    [banned] = batch.processors
    assert isinstance(banned, MinTokensProcessor) and not batch.needs_sync
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0]] * 2)
    assert Sampler()(logits, batch).sampled_token_ids == [2, 0]
    assert build_sampling_batch([done], [None], 4, "cpu").processors == []


def test_processors_built_in_list_order_and_only_when_used() -> None:
    plain = SamplingRow(SamplingParams(temperature=0.0))
    assert build_logits_processors([plain], 8, "cpu") == []
    both = SamplingRow(SamplingParams(min_tokens=2, presence_penalty=1.0), stop_token_ids=(3,),
                       output_token_ids=[1])
    built = build_logits_processors([plain, both], 8, "cpu")
    assert [type(p) for p in built] == [PenaltiesProcessor, MinTokensProcessor]
    assert [p.needs_sync for p in built] == [True, False]
    every = SamplingRow(SamplingParams(min_tokens=2, presence_penalty=1.0, logit_bias={1: 1.0},
                                       allowed_token_ids=[1, 2]), stop_token_ids=(3,), output_token_ids=[1],
                        bad_words_token_ids=[(5,)], allowed_token_bitmask=np.array([0b1010], dtype=np.int32))
    built = build_logits_processors([plain, every], 8, "cpu")
    assert [type(p) for p in built] == list(LOGITS_PROCESSORS) == [
        GrammarBitmaskProcessor, AllowedTokenIdsProcessor, BadWordsProcessor, LogitBiasProcessor,
        PenaltiesProcessor, MinTokensProcessor]
    assert [p.needs_sync for p in built] == [True, False, True, False, True, False]


def _greedy(rows: list[SamplingRow], logits: torch.Tensor) -> list[int]:
    batch = build_sampling_batch(rows, [None] * len(rows), logits.shape[1], "cpu")
    return Sampler()(logits.clone(), batch).sampled_token_ids


@settings(max_examples=40, deadline=None)
@given(allowed=st.lists(st.integers(0, 15), min_size=1, max_size=6), seed=st.integers(0, 2**31),
       temperature=st.sampled_from([0.0, 0.7, 1.5]))
def test_allowed_token_ids_sampled_token_always_in_the_set(allowed, seed, temperature) -> None:
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(seed)) * 5
    params = SamplingParams(temperature=temperature, allowed_token_ids=allowed, top_k=4, seed=seed)
    rows = [SamplingRow(params, seed=seed), SamplingRow(SamplingParams(temperature=temperature))]
    batch = build_sampling_batch(rows, [torch.Generator().manual_seed(seed), None], 16, "cpu")
    sampled = Sampler()(logits[:2].clone(), batch).sampled_token_ids
    assert sampled[0] in allowed
    if temperature == 0.0:  # the other row is untouched: its plain argmax
        assert sampled[1] == int(logits[1].argmax())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), target=st.integers(0, 15))
def test_logit_bias_bans_and_forces_a_greedy_token(seed, target) -> None:
    logits = torch.randn(1, 16, generator=torch.Generator().manual_seed(seed)) * 5
    top = int(logits[0].argmax())
    assert _greedy([SamplingRow(SamplingParams(temperature=0, logit_bias={top: -100}))], logits) != [top]
    assert _greedy([SamplingRow(SamplingParams(temperature=0, logit_bias={target: 100}))], logits) == [target]


def test_logit_bias_exact_values_and_logprobs_stay_raw() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    row = SamplingRow(SamplingParams(temperature=0, logit_bias={0: 2.5, 2: -1.0}, logprobs=1))
    batch = build_sampling_batch([row], [None], 3, "cpu")
    [bias] = batch.processors
    adjusted = logits.clone()
    bias.apply(adjusted)
    assert adjusted.tolist() == [[3.5, 2.0, 2.0]]
    out = Sampler()(logits.clone(), batch)
    assert out.sampled_token_ids == [0]
    # logprobs are those of the raw logits (before any processor), as vLLM returns by default
    raw = torch.log_softmax(logits, dim=-1)[0]
    assert abs(out.logprobs[0].logprob - float(raw[0])) < 1e-6 and out.logprobs[0].rank == 3


def test_bad_words_ban_the_last_token_after_its_prefix() -> None:
    words = [(7,), (2, 3), (4, 2, 5)]  # a one-token word, a two-token word, a three-token word
    logits = torch.zeros(4, 8)
    logits[:, [7, 3, 5]] = torch.tensor([3.0, 2.0, 1.0])  # greedy order: 7, then 3, then 5
    rows = [SamplingRow(SamplingParams(temperature=0), output_token_ids=out, bad_words_token_ids=words)
            for out in ([], [2], [4, 2], [2, 4])]
    # 7 always banned; 3 banned right after 2; 5 banned right after 4, 2; nothing else.
    assert _greedy(rows, logits) == [3, 5, 0, 3]
    batch = build_sampling_batch(rows[:1], [None], 8, "cpu")
    assert isinstance(batch.processors[0], BadWordsProcessor) and batch.needs_sync


def test_bad_words_processor_is_built_even_when_nothing_is_banned_now() -> None:
    row = SamplingRow(SamplingParams(temperature=0), output_token_ids=[1], bad_words_token_ids=[(2, 3)])
    [processor] = build_logits_processors([row], 8, "cpu")
    assert isinstance(processor, BadWordsProcessor) and processor.needs_sync  # the next step still reads
    logits = torch.arange(8.0).unsqueeze(0)
    processor.apply(logits)
    assert logits.tolist() == [list(map(float, range(8)))]


def test_constraints_apply_before_penalties() -> None:
    # bias first, then repetition: (0.5 + 2) / 2 = 1.25 < 1.5 (the other order: 0.25 + 2 = 2.25 > 1.5)
    logits = torch.tensor([[0.5, 1.5]])
    row = SamplingRow(SamplingParams(temperature=0, logit_bias={0: 2.0}, repetition_penalty=2.0),
                      prompt_token_ids=[0], output_token_ids=[])
    assert _greedy([row], logits) == [1]


def test_grammar_bitmask_keeps_the_allowed_tokens_of_constrained_rows_only() -> None:
    plain = SamplingRow(SamplingParams(temperature=0.0))
    assert GrammarBitmaskProcessor.build([plain, plain], 40, "cpu") is None  # nothing to pay
    # Tokens 1, 3 and 33 (word 1, bit 1): a bitmask wider than the logits is cut to their width.
    mask = np.array([0b1010, 0b10], dtype=np.int32)
    rows = [plain, SamplingRow(SamplingParams(temperature=0.0), allowed_token_bitmask=mask), plain]
    batch = build_sampling_batch(rows, [None] * 3, 40, "cpu")
    assert batch.needs_sync and not batch.is_plain_greedy
    logits = torch.arange(40, dtype=torch.float32).repeat(3, 1)
    assert Sampler()(logits, batch).sampled_token_ids == [39, 33, 39]
    [grammar] = batch.processors
    masked = torch.arange(40, dtype=torch.float32).repeat(3, 1)
    grammar.apply(masked)
    assert torch.isfinite(masked[1]).nonzero().flatten().tolist() == [1, 3, 33]
    assert torch.isfinite(masked[[0, 2]]).all()


@settings(max_examples=200, deadline=None)
@given(temperature=st.sampled_from([0.0, 0.7]), logprobs=st.sampled_from([None, 2]),
       repetition=st.sampled_from([1.0, 1.2]), presence=st.sampled_from([0.0, 0.5]),
       min_tokens=st.integers(0, 3), num_output=st.integers(0, 4), stop=st.sampled_from([(), (2,)]),
       bias=st.sampled_from([None, {}, {3: 1.0}]), allowed=st.sampled_from([None, [1, 2]]),
       bad_words=st.sampled_from([(), ((4,),)]), bitmask=st.booleans())
def test_plain_greedy_row_agrees_with_the_built_batch(temperature, logprobs, repetition, presence, min_tokens,
                                                      num_output, stop, bias, allowed, bad_words, bitmask) -> None:
    params = SamplingParams(temperature=temperature, logprobs=logprobs, repetition_penalty=repetition,
                            presence_penalty=presence, min_tokens=min_tokens, logit_bias=bias,
                            allowed_token_ids=allowed)
    row = SamplingRow(params, num_output_tokens=num_output, stop_token_ids=stop, output_token_ids=[4],
                      bad_words_token_ids=bad_words,
                      allowed_token_bitmask=np.full(1, -1, dtype=np.int32) if bitmask else None)
    assert adjusts_row(row) == bool(build_logits_processors([row], 8, "cpu"))
    plain = SamplingRow(SamplingParams(temperature=0.0))
    for rows in ([row], [plain, row]):
        assert build_sampling_batch(rows, [None] * len(rows), 8, "cpu").is_plain_greedy == \
            all(is_plain_greedy_row(r) for r in rows)
