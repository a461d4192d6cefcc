"""Each tensor-parallel layer on two gloo ranks against its single-process layer (fp32, 1e-5)."""
from __future__ import annotations

import torch
from torch import nn

from folovllm.distributed.group import TPGroup
from folovllm.model.layers import LMHead, VocabEmbedding
from folovllm.model.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    WeightConfig,
)
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod
from tests.helpers import run_ranks

CPU = torch.device("cpu")
TOL = dict(rtol=1e-5, atol=1e-5)


def _weights(group: TPGroup | None) -> WeightConfig:
    return WeightConfig.for_group(torch.float32, CPU, UnquantizedLinearMethod(), group)


def _load(layer: nn.Module, pieces: dict) -> None:
    """Loads checkpoint tensors into a layer's parameters through their own loaders."""
    for name, value in pieces.items():
        param_name, shard = name if isinstance(name, tuple) else (name, None)
        param = getattr(layer, param_name)
        if shard is None:
            param.weight_loader(param, value)
        else:
            param.weight_loader(param, value, shard)


def _check_linears(rank: int, group: TPGroup) -> None:
    gen = torch.Generator().manual_seed(0)  # the same checkpoint on every rank
    x = torch.randn(5, 8, generator=gen)

    w, b = torch.randn(12, 8, generator=gen), torch.randn(12, generator=gen)
    full, part = ColumnParallelLinear(8, 12, True, _weights(None)), ColumnParallelLinear(8, 12, True, _weights(group))
    for layer in (full, part):
        _load(layer, {"weight": w, "bias": b})
    torch.testing.assert_close(part(x), full(x).chunk(2, dim=-1)[rank], **TOL)

    gate, up = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    full = MergedColumnParallelLinear(8, [6, 6], False, _weights(None))
    part = MergedColumnParallelLinear(8, [6, 6], False, _weights(group))
    for layer in (full, part):
        _load(layer, {("weight", 0): gate, ("weight", 1): up})
    full_gate, full_up = full(x).chunk(2, dim=-1)
    # each piece split on its own: this rank's gate part, then its up part
    expected = torch.cat([full_gate.chunk(2, dim=-1)[rank], full_up.chunk(2, dim=-1)[rank]], dim=-1)
    torch.testing.assert_close(part(x), expected, **TOL)

    w, b = torch.randn(8, 12, generator=gen), torch.randn(8, generator=gen)
    x_wide = torch.randn(5, 12, generator=gen)
    full, part = RowParallelLinear(12, 8, True, _weights(None)), RowParallelLinear(12, 8, True, _weights(group))
    for layer in (full, part):
        _load(layer, {"weight": w, "bias": b})
    # the rank's slice of the input in, the whole output (bias added once) out
    torch.testing.assert_close(part(x_wide.chunk(2, dim=-1)[rank]), full(x_wide), **TOL)


def _check_qkv(rank: int, group: TPGroup, num_kv_heads: int) -> None:
    gen = torch.Generator().manual_seed(1)
    head_dim, num_heads = 2, 4
    x = torch.randn(3, 8, generator=gen)
    q = torch.randn(num_heads * head_dim, 8, generator=gen)
    k, v = (torch.randn(num_kv_heads * head_dim, 8, generator=gen) for _ in range(2))
    full = QKVParallelLinear(8, head_dim, num_heads, num_kv_heads, False, _weights(None))
    part = QKVParallelLinear(8, head_dim, num_heads, num_kv_heads, False, _weights(group))
    for layer in (full, part):
        _load(layer, {("weight", "q"): q, ("weight", "k"): k, ("weight", "v"): v})
    fq, fk, fv = full(x).split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    kv_heads = max(1, num_kv_heads // 2)
    assert (part.num_heads, part.num_kv_heads) == (2, kv_heads)
    pq, pk, pv = part(x).split([2 * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    torch.testing.assert_close(pq, fq.chunk(2, dim=-1)[rank], **TOL)
    # two KV heads: one each; one KV head: both ranks hold it (their query heads all attend with it)
    kv_part = rank if num_kv_heads == 2 else 0
    torch.testing.assert_close(pk, fk.chunk(num_kv_heads, dim=-1)[kv_part], **TOL)
    torch.testing.assert_close(pv, fv.chunk(num_kv_heads, dim=-1)[kv_part], **TOL)


def _check_vocab(rank: int, group: TPGroup) -> None:
    gen = torch.Generator().manual_seed(2)
    vocab, hidden = 11, 6  # odd: the last rank's slice is padded
    table = torch.randn(vocab, hidden, generator=gen)
    full, part = VocabEmbedding(vocab, hidden, _weights(None)), VocabEmbedding(vocab, hidden, _weights(group))
    for layer in (full, part):
        _load(layer, {"weight": table})
    ids = torch.tensor([0, 5, 6, 10, 3, 10])  # ids on both ranks' slices, repeated
    torch.testing.assert_close(part(ids), full(ids), **TOL)

    h = torch.randn(4, hidden, generator=gen)
    full_head, part_head = LMHead(hidden, vocab, _weights(None)), LMHead(hidden, vocab, _weights(group))
    for layer in (full_head, part_head):
        _load(layer, {"weight": table})
    assert part_head.weight.shape == (6, hidden)
    gathered = group.gather_to_first(part_head(h))
    if rank == 0:  # the padded row's logit is cut off, as compute_logits does
        torch.testing.assert_close(gathered[:, :vocab], full_head(h), **TOL)
    tied_full, tied_part = LMHead(hidden, vocab, _weights(None)), LMHead(hidden, vocab, _weights(group))
    tied_full.tie(full)
    tied_part.tie(part)  # the embedding table as the LM head
    assert tied_part.weight is part.weight
    tied = group.gather_to_first(tied_part(h))
    if rank == 0:
        torch.testing.assert_close(tied[:, :vocab], tied_full(h), **TOL)


def _check_all(rank: int, group: TPGroup) -> None:
    _check_linears(rank, group)
    _check_qkv(rank, group, num_kv_heads=2)
    _check_qkv(rank, group, num_kv_heads=1)
    _check_vocab(rank, group)


def test_parallel_layers_match_their_single_process_layers() -> None:
    run_ranks(_check_all, 2)
