"""Prompt logprobs: for the prefill rows that ask, the logprob of the next prompt token and the top-k.

Row ``j`` of a prompt chunk (position ``p``) predicts the prompt token at ``p + 1``. Only the rows of
requests that ask are turned into logits, in fp32 ``log_softmax``, a slice of rows at a time so a long
chunk never holds a full ``[rows, vocab]`` fp32 tensor at once.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from folovllm.sample.sampler import TokenLogprobs
from folovllm.sample.top_entries import top_entries

# Rows turned into fp32 logprobs at once: bounds the transient [rows, vocab] tensors.
DEFAULT_SLICE_ROWS = 512


@dataclass(slots=True)
class PromptLogprobsRequest:
    """One request's share of a step that wants prompt logprobs, as plain data (sent to the worker)."""

    num_logprobs: int  # top-k alternatives per position (SamplingParams.prompt_logprobs)
    first_position: int  # prompt position the chunk's first row predicts (num_computed_tokens + 1)
    target_token_ids: list[int]  # the prompt tokens its first len(...) rows predict, in order


@dataclass(slots=True)
class PromptLogprobsChunk:
    """What the worker hands back: one entry per predicted prompt position, from ``first_position``."""

    request_id: str
    first_position: int
    entries: list[TokenLogprobs]


@dataclass
class PromptLogprobsBatch:
    """A step's prompt-logprob rows, all requests together: rows of the hidden states and targets."""

    request_ids: list[str]
    requests: list[PromptLogprobsRequest]
    row_indices: list[int]  # rows of the step's hidden states, requests one after another
    target_token_ids: list[int]  # the token each of those rows predicts

    @property
    def max_num_logprobs(self) -> int:
        return max(r.num_logprobs for r in self.requests)


@dataclass
class PromptLogprobsTensors:
    """The computed values, still on the device; ``to_host`` turns them into chunks."""

    batch: PromptLogprobsBatch
    chosen: torch.Tensor  # [rows] logprob of the actual next prompt token
    ranks: torch.Tensor  # [rows] 1 + tokens with a strictly higher logprob
    top_values: torch.Tensor  # [rows, max_k]
    top_ids: torch.Tensor  # [rows, max_k]

    def to_host(self) -> list[PromptLogprobsChunk]:
        chosen, ranks = self.chosen.tolist(), self.ranks.tolist()
        top_values, top_ids = self.top_values.tolist(), self.top_ids.tolist()
        chunks, row = [], 0
        for request_id, request in zip(self.batch.request_ids, self.batch.requests):
            k = request.num_logprobs
            entries = []
            for target in request.target_token_ids:
                entries.append(TokenLogprobs(target, chosen[row], ranks[row],
                                             list(zip(top_ids[row][:k], top_values[row][:k]))))
                row += 1
            chunks.append(PromptLogprobsChunk(request_id, request.first_position, entries))
        return chunks


def compute_prompt_logprobs(hidden: torch.Tensor, batch: PromptLogprobsBatch,
                            compute_logits: Callable[[torch.Tensor], torch.Tensor],
                            slice_rows: int = DEFAULT_SLICE_ROWS) -> PromptLogprobsTensors:
    """Logprobs of each row's target token, its rank and the top-k, ``slice_rows`` rows at a time."""
    device = hidden.device
    rows = torch.tensor(batch.row_indices, dtype=torch.int64, device=device)
    targets = torch.tensor(batch.target_token_ids, dtype=torch.int64, device=device)
    k = batch.max_num_logprobs
    chosen, ranks, top_values, top_ids = [], [], [], []
    for start in range(0, rows.numel(), slice_rows):
        logits = compute_logits(hidden[rows[start:start + slice_rows]])
        logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        picked = logprobs.gather(1, targets[start:start + slice_rows].unsqueeze(1))
        chosen.append(picked.squeeze(1))
        ranks.append((logprobs > picked).sum(dim=-1) + 1)
        values, ids = top_entries(logprobs, k)
        top_values.append(values)
        top_ids.append(ids)
    return PromptLogprobsTensors(batch, torch.cat(chosen), torch.cat(ranks), torch.cat(top_values),
                                 torch.cat(top_ids))
