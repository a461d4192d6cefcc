"""Linear layers that own how their weights load: each parameter's ``weight_loader`` knows its shard.

The layer decides *which part* of a checkpoint tensor it keeps (its q/k/v or gate/up slot in a merged
weight; its rank's rows or columns under tensor parallelism); the ``LinearMethod`` decides *how* the
weight is held and multiplied. (tp_rank, tp_size) defaults to (0, 1): one process holds everything.
With tp_size > 1 each rank loads its slice through the same loaders; what tensor parallelism still
has to add is the all-reduce after a row-parallel layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from folovllm.model.linear_method import LinearMethod, UnquantizedLinearMethod

ShardId = int | str


@dataclass(frozen=True)
class WeightConfig:
    """How a model's layers hold their weights: dtype, device, linear method, tensor-parallel rank, CPU packing."""

    dtype: torch.dtype
    device: torch.device
    linear_method: LinearMethod = field(default_factory=UnquantizedLinearMethod)
    tp_rank: int = 0
    tp_size: int = 1
    cpu_prepack: bool = False  # unquantized tensors outside linear_method (the LM head) are held prepacked too

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank={self.tp_rank} must lie in [0, tp_size={self.tp_size})")


def _split(size: int, tp_size: int, what: str) -> int:
    if size % tp_size != 0:
        raise ValueError(f"{what}={size} is not divisible by tp_size={tp_size}")
    return size // tp_size


def _copy_checked(dest: torch.Tensor, loaded: torch.Tensor) -> None:
    if dest.shape != loaded.shape:
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(loaded)  # casts to the parameter's dtype


def _rank_part(dest: torch.Tensor, loaded: torch.Tensor, dim: int, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This rank's slice (the size of ``dest``) along ``dim`` of a checkpoint tensor holding every rank's."""
    size = dest.shape[dim]
    expected = (*dest.shape[:dim], size * tp_size, *dest.shape[dim + 1:])
    if loaded.shape != expected:
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {expected}")
    return loaded.narrow(dim, tp_rank * size, size)


def _packed(outputs: int, pack_factor: int) -> int:
    """An output offset or size in elements of a parameter that packs ``pack_factor`` outputs in one."""
    if outputs % pack_factor:
        raise ValueError(f"shard boundary at {outputs} outputs falls inside a packed element "
                         f"({pack_factor} outputs each)")
    return outputs // pack_factor


def _load_shared(param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId) -> None:
    """A parameter every piece carries whole (a shared input permutation): the pieces must agree.

    The parameter starts filled with -1 (``create_weights``), so the first piece in fills it.
    """
    if bool((param.data == -1).all()):
        _copy_checked(param.data, loaded)
    elif param.shape != loaded.shape or not torch.equal(param.data, loaded.to(param.dtype)):
        raise ValueError(f"(piece {shard_id!r}) differs from the other pieces of its merged weight, "
                         "which share one input and must carry the same tensor")


class LinearBase(nn.Module):
    """y = x W^T (+ b) through ``weights.linear_method``; subclasses say how a checkpoint tensor maps in."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool, weights: WeightConfig, method: LinearMethod | None = None
    ) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size  # this rank's part
        self.tp_rank, self.tp_size = weights.tp_rank, weights.tp_size
        self.method = method or weights.linear_method
        self.method.create_weights(self, input_size, output_size, bias, weights.dtype, weights.device)
        for param in self.parameters(recurse=False):
            param.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """Copy a whole checkpoint tensor into ``param``; ValueError on a shape mismatch."""
        _copy_checked(param.data, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole weight (e.g. the LM head)."""


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank keeps its contiguous block of rows."""

    def __init__(self, input_size: int, output_size: int, bias: bool, weights: WeightConfig) -> None:
        super().__init__(input_size, _split(output_size, weights.tp_size, "output_size"), bias, weights)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        dim = getattr(param, "output_dim", None)
        if dim is not None:
            loaded = _rank_part(param.data, loaded, dim, self.tp_rank, self.tp_size)
        _copy_checked(param.data, loaded)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up); checkpoint piece ``i`` fills slot ``i``."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool, weights: WeightConfig) -> None:
        super().__init__(input_size, sum(output_sizes), bias, weights)
        self.output_sizes = [_split(size, weights.tp_size, "output_size") for size in output_sizes]
        for param in self.parameters(recurse=False):
            param.shard_ids = self.shard_ids()

    def shard_ids(self) -> tuple[ShardId, ...]:
        """The checkpoint pieces that together fill each parameter."""
        return tuple(range(len(self.output_sizes)))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId | None = None) -> None:
        """Copy this rank's part of checkpoint piece ``shard_id`` into its slot of the merged weight."""
        if shard_id not in self.shard_ids():
            raise ValueError(f"fills a merged weight by pieces {self.shard_ids()}, not {shard_id!r}")
        index = self.shard_ids().index(shard_id)
        offset, size = sum(self.output_sizes[:index]), self.output_sizes[index]
        dim = getattr(param, "output_dim", None)
        if dim is None:
            if getattr(param, "same_for_every_shard", False):
                _load_shared(param, loaded, shard_id)
                return
            raise ValueError("fills a merged weight that its linear method did not split by output")
        if getattr(param, "packed_dim", None) == dim:  # several outputs per element (packed low-bit codes)
            offset, size = _packed(offset, param.pack_factor), _packed(size, param.pack_factor)
        dest = param.data.narrow(dim, offset, size)
        _copy_checked(dest, _rank_part(dest, loaded, dim, self.tp_rank, self.tp_size))


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k and v projections in one matmul; shards "q", "k", "v"; heads split across ranks."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool, weights: WeightConfig
    ) -> None:
        heads = _split(num_heads, weights.tp_size, "num_attention_heads")
        kv_heads = _split(num_kv_heads, weights.tp_size, "num_key_value_heads")
        kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, [num_heads * head_dim, kv_size, kv_size], bias, weights)
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, heads, kv_heads  # this rank's heads

    def shard_ids(self) -> tuple[ShardId, ...]:
        return ("q", "k", "v")


class RowParallelLinear(LinearBase):
    """Input features split across ranks; each rank keeps its block of columns, rank 0 adds the bias."""

    def __init__(self, input_size: int, output_size: int, bias: bool, weights: WeightConfig) -> None:
        super().__init__(_split(input_size, weights.tp_size, "input_size"), output_size, bias, weights)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        dim = getattr(param, "input_dim", None)
        if dim is not None:
            loaded = _rank_part(param.data, loaded, dim, self.tp_rank, self.tp_size)
        _copy_checked(param.data, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            raise NotImplementedError("row-parallel partial sums need an all-reduce across ranks")
        return self.method.apply(self, x, self.bias)
