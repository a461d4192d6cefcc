"""The one rule for comparing our greedy tokens with transformers' (used by every e2e test).

Greedy sequences must be identical, except that they may part at a step where transformers' own
top-2 log-probabilities are within ``TOP2_TOLERANCE`` (a near-tie that float rounding may flip);
after such a step the continuations legitimately differ and are not compared further.
"""
from __future__ import annotations

import torch

TOP2_TOLERANCE = 1e-3
# The same rule between two bf16 runs (GPU kernels vs the CPU torch backend, or vs transformers on the
# GPU): bf16 keeps 8 bits of mantissa, so logits of magnitude 8-16 are spaced 0.0625 apart, and two kernels that accumulate in
# another order can land a few spacings apart: tokens within 4 spacings may swap.
BF16_TOP2_TOLERANCE = 0.25


def top2_gaps(step_logits: list[torch.Tensor]) -> list[float]:
    """Gap between the best and second-best log-probability at each reference step."""
    gaps = []
    for logits in step_logits:
        top = torch.log_softmax(logits.float().flatten(), dim=-1).topk(2).values
        gaps.append(float(top[0] - top[1]))
    return gaps


def logprob_gaps(completion) -> list[float]:
    """The same gap at each step of one of our completions, from its own logprobs (``logprobs >= 2``)."""
    result = []
    for step in completion.logprobs:
        top = sorted((lp.logprob for lp in step.values()), reverse=True)
        result.append(top[0] - top[1])
    return result


def hf_greedy(model, prompt: list[int], max_new_tokens: int,
              ignore_eos: bool = True) -> tuple[list[int], list[float]]:
    """A transformers model's greedy continuation on the model's own device (a full forward per token, so
    nothing of ``generate``'s own rules such as masking EOS before ``min_new_tokens``), and its top-2 gap at
    each step; it stops after an EOS unless ``ignore_eos``."""
    tokens, gaps = list(prompt), []
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([tokens], device=model.device)).logits[0, -1].cpu()
            gaps += top2_gaps([logits])
            tokens.append(int(logits.argmax()))
            if not ignore_eos and tokens[-1] in eos:
                break
    return tokens[len(prompt):], gaps


def assert_greedy_match(ours: list[int], reference: list[int], reference_gaps: list[float],
                        tolerance: float = TOP2_TOLERANCE) -> None:
    # the gaps come out of an fp32 log-softmax: a gap of exactly the tolerance (bf16 logits 0.25 apart) may
    # read a few fp32 steps above it
    for step, (a, b) in enumerate(zip(ours, reference)):
        if a != b:
            assert reference_gaps[step] <= tolerance * (1 + 1e-5), (
                f"greedy tokens differ at step {step} ({a} vs reference {b}) although the reference's "
                f"top-2 logprobs are {reference_gaps[step]:.2e} apart (> {tolerance})")
            return
    assert len(ours) == len(reference), f"lengths differ: {len(ours)} vs {len(reference)}"
