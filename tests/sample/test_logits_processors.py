"""Logits processors: exact penalty values, min_tokens banning, and the one ordered list."""
from __future__ import annotations

import numpy as np
import torch

from folovllm.sample.logits_processors import (LOGITS_PROCESSORS, GrammarBitmaskProcessor, MinTokensProcessor,
                                               PenaltiesProcessor, build_logits_processors)
from folovllm.sample.metadata import SamplingRow, build_sampling_batch
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
    constrained = SamplingRow(SamplingParams(min_tokens=2, presence_penalty=1.0), stop_token_ids=(3,),
                              output_token_ids=[1], allowed_token_bitmask=np.array([0b1010], dtype=np.int32))
    built = build_logits_processors([plain, constrained], 8, "cpu")
    assert [type(p) for p in built] == list(LOGITS_PROCESSORS) == [PenaltiesProcessor, MinTokensProcessor,
                                                                   GrammarBitmaskProcessor]
    assert [p.needs_sync for p in built] == [True, False, True]


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
