"""The vocabulary's two ends: the embedding lookup and the LM head (the output projection).

Both are split by vocabulary rows under tensor parallelism (``vocab_shard``). The head is a linear like
any other: its ``LinearMethod`` holds the weight (plain, packed for a kernel, int8 rows, or a GGUF file's
blocks) and may offer a greedy argmax straight from the hidden states. A head tied to the embedding takes
the embedding's table as its weight (``LMHead.tie``); where its method then holds a form that can serve
lookups (int8 rows, our kernel's packed blocks), the lookup reads those rows and the float table is dropped.
A GGUF table kept in its file's type is read the same way (``read_rows_from``), tied or not.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from folovllm.model.arch import ArchConfig
from folovllm.model.layers.linear import LinearBase, WeightConfig, all_reduce


def vocab_shard(vocab_size: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """(first token id, rows) of a rank's slice of the vocabulary: ceil(vocab / tp_size) rows each,
    the last rank's tail padded with zero rows (their logits are cut off after the gather)."""
    rows = -(-vocab_size // tp_size)
    return tp_rank * rows, rows


def load_vocab_rows(param: nn.Parameter, loaded: torch.Tensor, first: int, vocab_size: int) -> None:
    """Copy rows [first, first + rows) of a [vocab, hidden] checkpoint tensor; rows past the vocab are 0."""
    if loaded.shape != (vocab_size, *param.shape[1:]):
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {(vocab_size, *param.shape[1:])}")
    end = min(first + param.shape[0], vocab_size)
    param.data.zero_()
    param.data[:end - first].copy_(loaded[first:end])


class VocabEmbedding(nn.Module):
    """Token id -> hidden vector.

    Vocab-parallel: each rank holds a slice of the rows (``vocab_shard``), looks up the ids that fall
    in it (zeros for the others) and the ranks' vectors are summed.
    """

    def __init__(self, vocab_size: int, hidden_size: int, weights: WeightConfig) -> None:
        super().__init__()
        self.vocab_size, self.dtype = vocab_size, weights.dtype
        self.tp_size, self.tp_group = weights.tp_size, weights.tp_group
        self.first, self.rows = vocab_shard(vocab_size, weights.tp_rank, weights.tp_size)
        self.weight = nn.Parameter(
            torch.empty(self.rows, hidden_size, dtype=weights.dtype, device=weights.device), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader
        # a packed table whose rows are read instead (``rows_of``): a tied head's, or a GGUF file's
        self.row_table: nn.Module | None = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """This rank's rows of the checkpoint's [vocab, hidden] table."""
        load_vocab_rows(param, loaded, self.first, self.vocab_size)

    def read_rows_from(self, table: nn.Module) -> None:
        """Look rows up in a packed table (a tied head's, or a GGUF table; its ``rows_of(ids, dtype)`` reads
        them per lookup) and drop the float one."""
        self.row_table = table
        del self.weight

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.row_table is not None:
            return self.row_table.rows_of(ids, self.dtype)
        return F.embedding(ids, self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._lookup(input_ids)
        local = input_ids - self.first
        outside = (local < 0) | (local >= self.rows)
        x = self._lookup(local.masked_fill(outside, 0))
        x.masked_fill_(outside.unsqueeze(-1), 0)
        return all_reduce(x, self.tp_group, self.tp_size, "a vocab-parallel embedding")


class LMHead(LinearBase):
    """The output projection [vocab, hidden] (this rank's vocabulary rows), in the model dtype."""

    def __init__(self, hidden_size: int, vocab_size: int, weights: WeightConfig) -> None:
        self.vocab_size = vocab_size
        self.first, rows = vocab_shard(vocab_size, weights.tp_rank, weights.tp_size)
        super().__init__(hidden_size, rows, False, weights, weights.head_method)
        self.tied: VocabEmbedding | None = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        load_vocab_rows(param, loaded, self.first, self.vocab_size)

    def tie(self, embedding: VocabEmbedding) -> None:
        """Take the embedding's table as this head's weight: the checkpoint fills it once, through the
        embedding's loader (before loading only)."""
        self.weight = embedding.weight
        self.tied = embedding

    def finish_tie(self) -> None:
        """Once the method has processed the weight: where the form it holds can serve lookups (int8 rows,
        our kernel's packed blocks), the tied embedding reads its rows from it and drops its own table."""
        table = self.method.row_table(self) if self.tied is not None else None
        if table is not None:
            self.tied.read_rows_from(table)

    def greedy_argmax(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """Each row's greedy token straight from the hidden states, where this head's method offers it
        for the whole vocabulary on one rank; else None."""
        if self.tp_size != 1 or self.output_size != self.vocab_size:
            return None
        return self.method.argmax(self)


def lm_head(arch: ArchConfig, weights: WeightConfig, embedding: VocabEmbedding) -> LMHead:
    """The model's LM head (``weights.head_method`` holds it), tied to ``embedding`` where the model ties them."""
    head = LMHead(arch.hidden_size, arch.vocab_size, weights)
    if arch.tie_word_embeddings:
        head.tie(embedding)
    return head
