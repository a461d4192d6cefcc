"""Linear layers that own how their weights load: each parameter's ``weight_loader`` knows its shard.

The layer decides *which part* of a checkpoint tensor it keeps (its q/k/v or gate/up slot in a merged
weight; its rank's rows or columns under tensor parallelism); the ``LinearMethod`` decides *how* the
weight is held and multiplied. (tp_rank, tp_size) defaults to (0, 1): one process holds everything.
With tp_size > 1 each rank loads its slice through the same loaders, and a row-parallel layer sums
its partial outputs over ``WeightConfig.tp_group``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from folovllm.distributed.group import TPGroup
from folovllm.model.quantization.linear_method import LinearMethod, UnquantizedLinearMethod

ShardId = int | str


@dataclass(frozen=True)
class WeightConfig:
    """How a model's layers hold their weights: dtype, device, the linear methods, the tensor-parallel rank.

    ``linear_method`` holds every decoder linear, ``head_method`` the LM head (whose checkpoint weight is
    float even in a quantized checkpoint); both come from ``quantization.select_linear_methods``.
    """

    dtype: torch.dtype
    device: torch.device
    linear_method: LinearMethod = field(default_factory=UnquantizedLinearMethod)
    tp_rank: int = 0
    tp_size: int = 1
    tp_group: TPGroup | None = None  # the collectives between ranks (None: loading slices only, no forward)
    head_method: LinearMethod = field(default_factory=UnquantizedLinearMethod)

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank={self.tp_rank} must lie in [0, tp_size={self.tp_size})")
        group = self.tp_group
        if group is not None and (group.rank, group.size) != (self.tp_rank, self.tp_size):
            raise ValueError(f"tp_group is rank {group.rank} of {group.size}, but the weights are for "
                             f"rank {self.tp_rank} of {self.tp_size}")

    @classmethod
    def for_group(cls, dtype: torch.dtype, device: torch.device, linear_method: LinearMethod,
                  tp_group: TPGroup | None, head_method: LinearMethod | None = None) -> WeightConfig:
        """This rank's weights: its (tp_rank, tp_size) read from ``tp_group`` (None: a single process)."""
        rank, size = (tp_group.rank, tp_group.size) if tp_group is not None else (0, 1)
        return cls(dtype, device, linear_method, rank, size, tp_group, head_method or UnquantizedLinearMethod())


def all_reduce(x: torch.Tensor, tp_group: TPGroup | None, tp_size: int, what: str) -> torch.Tensor:
    """Sums a rank's partial result over the group (nothing to do for one rank)."""
    if tp_size == 1:
        return x
    if tp_group is None:
        raise RuntimeError(f"{what} with tp_size={tp_size} needs an all-reduce across ranks: "
                           "build its WeightConfig with a tp_group")
    return tp_group.all_reduce(x)


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: a share when there are at least tp_size, else one (replicated)."""
    if num_kv_heads >= tp_size:
        return _split(num_kv_heads, tp_size, "num_key_value_heads")
    if tp_size % num_kv_heads:
        raise ValueError(f"num_key_value_heads={num_kv_heads} is fewer than tp_size={tp_size} and does not "
                         "divide it, so the heads cannot be replicated evenly; pick a tp_size that divides "
                         "or is divided by it")
    return 1


def _split(size: int, tp_size: int, what: str) -> int:
    if size % tp_size != 0:
        raise ValueError(f"{what}={size} is not divisible by tp_size={tp_size}")
    return size // tp_size


def _copy_checked(dest: torch.Tensor, loaded: torch.Tensor) -> None:
    if dest.shape != loaded.shape:
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(loaded)  # casts to the parameter's dtype


def _rank_part(dest: torch.Tensor, loaded: torch.Tensor, dim: int, part: int, num_parts: int) -> torch.Tensor:
    """Part ``part`` of ``num_parts`` (the size of ``dest``) along ``dim`` of a checkpoint tensor.

    The part is the rank's own (part, num_parts) = (tp_rank, tp_size), or the replicated KV head it
    shares with other ranks.
    """
    size = dest.shape[dim]
    expected = (*dest.shape[:dim], size * num_parts, *dest.shape[dim + 1:])
    if loaded.shape != expected:
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {expected}")
    return loaded.narrow(dim, part * size, size)


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
        self.tp_rank, self.tp_size, self.tp_group = weights.tp_rank, weights.tp_size, weights.tp_group
        self.has_bias, self.params_dtype, self.params_device = bias, weights.dtype, weights.device
        self.use_method(method or weights.linear_method)

    def use_method(self, method: LinearMethod) -> None:
        """Hold the weight through ``method``: its parameters are created anew (before loading only).

        A checkpoint that stores layers in different formats (a GGUF file) picks a method per layer.
        """
        for name, _ in list(self.named_parameters(recurse=False)):
            delattr(self, name)
        self.method = method
        method.create_weights(self, self.input_size, self.output_size, self.has_bias, self.params_dtype,
                              self.params_device)
        for param in self.parameters(recurse=False):
            param.weight_loader = self.weight_loader
            self.tag_param(param)

    def tag_param(self, param: nn.Parameter) -> None:
        """Mark a new parameter with what this layer's loader needs beyond its method's tags."""

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """Copy a whole checkpoint tensor into ``param``; ValueError on a shape mismatch."""
        _copy_checked(param.data, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)

    def bound(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward`` as one callable that holds what it reads (``compilation/direct.py``); build it after loading."""
        if self.tp_size > 1:
            return self.forward  # the row-parallel sum and the rank-0 bias stay in forward
        return self.method.bind(self, self.bias)


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole weight."""


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
    """Several column-parallel outputs in one matmul (gate and up); checkpoint piece ``i`` fills slot ``i``.

    Each piece is split across ranks on its own (a rank holds its part of gate, then its part of up),
    never the merged tensor cut in N.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool, weights: WeightConfig,
                 rank_output_sizes: list[int] | None = None) -> None:
        """``rank_output_sizes``: each piece's size on this rank when it is not ``size / tp_size``."""
        if rank_output_sizes is None:
            rank_output_sizes = [_split(size, weights.tp_size, "output_size") for size in output_sizes]
        self.output_sizes = rank_output_sizes
        LinearBase.__init__(self, input_size, sum(rank_output_sizes), bias, weights)

    def tag_param(self, param: nn.Parameter) -> None:
        param.shard_ids = self.shard_ids()

    def shard_ids(self) -> tuple[ShardId, ...]:
        """The checkpoint pieces that together fill each parameter."""
        return tuple(range(len(self.output_sizes)))

    def shard_part(self, shard_id: ShardId) -> tuple[int, int]:
        """(part, num_parts): which slice of checkpoint piece ``shard_id`` this rank holds."""
        return self.tp_rank, self.tp_size

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
        _copy_checked(dest, _rank_part(dest, loaded, dim, *self.shard_part(shard_id)))


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k and v projections in one matmul; shards "q", "k", "v"; heads split across ranks.

    With fewer KV heads than ranks each rank holds one KV head, the one its query heads attend with
    (ranks ``r * tp_size / num_kv_heads ...`` share KV head ``r``).
    """

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool, weights: WeightConfig
    ) -> None:
        heads = _split(num_heads, weights.tp_size, "num_attention_heads")
        kv_heads = kv_heads_per_rank(num_kv_heads, weights.tp_size)
        self.total_num_kv_heads = num_kv_heads
        kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, [num_heads * head_dim, kv_size, kv_size], bias, weights,
                         [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, heads, kv_heads  # this rank's heads

    def shard_ids(self) -> tuple[ShardId, ...]:
        return ("q", "k", "v")

    def shard_part(self, shard_id: ShardId) -> tuple[int, int]:
        if shard_id == "q" or self.total_num_kv_heads >= self.tp_size:
            return self.tp_rank, self.tp_size
        return self.tp_rank * self.total_num_kv_heads // self.tp_size, self.total_num_kv_heads  # replicated


class RowParallelLinear(LinearBase):
    """Input features split across ranks; each rank keeps its block of columns, rank 0 adds the bias,
    and the partial outputs are summed over the group (all-reduce)."""

    def __init__(self, input_size: int, output_size: int, bias: bool, weights: WeightConfig) -> None:
        super().__init__(_split(input_size, weights.tp_size, "input_size"), output_size, bias, weights)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        dim = getattr(param, "input_dim", None)
        if dim is not None:
            loaded = _rank_part(param.data, loaded, dim, self.tp_rank, self.tp_size)
        _copy_checked(param.data, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp_rank == 0 else None  # added once, not once per rank
        return all_reduce(self.method.apply(self, x, bias), self.tp_group, self.tp_size, "a row-parallel linear")
