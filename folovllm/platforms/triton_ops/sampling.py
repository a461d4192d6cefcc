"""Sampling's random draw as a Triton kernel: each row's token is ``argmax(probs / q)`` with ``q ~ Exp(1)`` per
token (the law of ``multinomial(probs)``), where q comes from Philox keyed by the row's (seed, counter) and the
token's index alone. A seeded request therefore draws the same noise whatever its batch, and a step replayed in
a CUDA graph draws what the same step run eagerly would: nothing is read from a host-side generator.

The vocabulary is cut into ``CHUNK``-wide pieces, one program each, so one row fills many SMs; each piece's best
(score, token) is kept and the row's best piece chosen after (a tie between pieces goes to the first).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096  # vocabulary entries per program


@triton.jit
def _race_kernel(probs_ptr, seeds_ptr, counters_ptr, best_ptr, index_ptr, vocab_size, stride_p, num_chunks,
                 CHUNK: tl.constexpr):
    """Program (row, chunk): the chunk's largest probs / q and its token (the first of equals)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    tokens = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = tokens < vocab_size
    seed = tl.load(seeds_ptr + row)
    counter = tl.load(counters_ptr + row)
    uniform = tl.rand(seed, (counter << 32) + tokens.to(tl.int64))  # [0, 1): q = -log(u) is Exp(1)
    noise = -tl.log(tl.maximum(uniform, 1e-30))
    probs = tl.load(probs_ptr + row * stride_p + tokens, mask=valid, other=0.0)
    score = tl.where(valid, probs / noise, -1.0)
    best = tl.max(score, axis=0)
    index = tl.min(tl.where(score == best, tokens, vocab_size), axis=0)
    tl.store(best_ptr + row * num_chunks + chunk, best)
    tl.store(index_ptr + row * num_chunks + chunk, index.to(tl.int64))


def exponential_race(probs: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """probs [N, V] (fp32, unit stride along V), seeds and counters [N] int64 -> each row's token [N] int64."""
    rows, vocab_size = probs.shape
    if probs.stride(1) != 1 or probs.dtype != torch.float32:
        raise ValueError("exponential_race: float32 probabilities with unit stride along the vocabulary")
    num_chunks = triton.cdiv(vocab_size, CHUNK)
    best = torch.empty(rows, num_chunks, dtype=torch.float32, device=probs.device)
    index = torch.empty(rows, num_chunks, dtype=torch.int64, device=probs.device)
    if rows:
        _race_kernel[(rows, num_chunks)](probs, seeds, counters, best, index, vocab_size, probs.stride(0),
                                         num_chunks, CHUNK=CHUNK)
    return index.gather(1, best.argmax(dim=1, keepdim=True)).squeeze(1)
