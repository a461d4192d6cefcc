"""Unquantized weights held for a CPU kernel: packed once for ours or prepacked for oneDNN.

A plain ``F.linear`` on CPU re-lays out (or reads strided) its weight on every call; holding it in the
blocked layout the GEMM kernel wants makes small-batch matmuls (decode) about twice as fast. For oneDNN
(``torch.ops.mkldnn``) bf16 results are bit-identical to ``F.linear`` (the same oneDNN kernel family
accumulates in fp32 either way); fp32 ones differ in the last bits (oneDNN instead of MKL's sgemm).

Our kernel (``torch.ops.folovllm.linear``, csrc/cpu/linear.cpp) streams the weight faster than
oneDNN at decode (a batch-1 step is mostly reading weights) and keeps up with it at larger batches. It
takes bf16 weights of a multiple of 64 rows and an even number of columns; others stay with the fallback
(oneDNN where it takes the dtype, else plain). It too accumulates in fp32, in its own order: results equal
``F.linear``'s or differ by one bf16 rounding step.

``select_linear_methods`` is the one place that picks a model's methods: the checkpoint's format for its
decoder linears, the platform's kernels (``LinearKernels``) for how each is multiplied, and the LM head's.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from folovllm.model.quantization.linear_method import LinearMethod, UnquantizedLinearMethod, get_linear_method
from folovllm.model.quantization.lm_head import Int8HeadMethod
from folovllm.model.quantization.op_call import bound_op_call
from folovllm.platforms.interface import LinearKernels

UNQUANTIZED = "unquantized"
KERNEL_ROWS = 64  # our kernel packs weights in blocks of this many output rows
# rows per GEMM call in the row-invariant torch form: every call one shape, so one algorithm and blocking
ROW_TILE = 16


def kernel_fits(weight: torch.Tensor) -> bool:
    """Whether our kernel takes this [out, in] weight (the platform says whether it runs here)."""
    out_features, in_features = weight.shape
    return weight.dtype == torch.bfloat16 and out_features % KERNEL_ROWS == 0 and in_features % 2 == 0


def pack_linear_weight(weight: torch.Tensor, ours: bool = False, onednn: bool = True) -> torch.Tensor:
    """A plain [out, in] weight packed for our kernel ([out/64, in/2, 64, 2], ``ours`` and it fits), or in
    oneDNN's blocked layout (an opaque mkldnn tensor of the same shape, ``onednn``), or as it is."""
    if ours and kernel_fits(weight):
        return torch.ops.folovllm.linear_pack(weight.detach())
    if onednn:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
    return weight.detach()


def row_tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ weight^T (+ bias) in GEMM calls of exactly ``ROW_TILE`` rows (the last one padded with
    zeros): a GEMM chooses its algorithm and blocking by the shape, so a row's sums would otherwise change with
    the number of rows beside it; with one shape they run one way (tests/model/test_row_invariance.py)."""
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    out = rows.new_empty(count + -count % ROW_TILE, weight.shape[0])
    weight_t = weight.t()
    full = count - count % ROW_TILE
    for start in range(0, full, ROW_TILE):
        torch.mm(rows[start:start + ROW_TILE], weight_t, out=out[start:start + ROW_TILE])
    if full < count:
        last = rows.new_zeros(ROW_TILE, rows.shape[1])
        last[:count - full] = rows[full:]
        torch.mm(last, weight_t, out=out[full:])
    out = out[:count]
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ packed^T (+ bias): one call of the kernel the weight was packed for."""
    if packed.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if packed.dim() == 4:
        return torch.ops.folovllm.linear(x, packed, bias)
    return torch.nn.functional.linear(x, packed, bias)


class PackedRows(nn.Module):
    """Rows of a weight packed for our kernel ([out/64, in/2, 64, 2]) read back as [..., in], unchanged: the
    lookup of an embedding whose tied head holds the table's only copy (a gather of a few rows per step)."""

    def __init__(self, packed: nn.Parameter) -> None:
        super().__init__()
        self.weight = packed  # the head's own parameter: held (and counted) once

    def rows_of(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        blocks, pairs, block_rows, _ = self.weight.shape
        # each input pair is one 32-bit word: gathering words from a [block, row, pair] view is several times
        # faster than gathering bf16 pairs (views made per call: the huge-page move replaces the storage)
        words = self.weight.view(torch.int32).view(blocks, pairs, block_rows).transpose(1, 2)
        return words[ids // block_rows, ids % block_rows].view(self.weight.dtype).to(dtype)


class PackedLinearMethod(UnquantizedLinearMethod):
    """An unquantized weight that loads plain (so merged shards fill their slots) and is then packed.

    After ``process_weights_after_loading`` the layer's ``weight`` parameter holds the packed tensor
    (same element count, so weight bytes stay honest); nothing reads it as a plain tensor.
    ``ours``: pack for our kernel where the weight fits it; ``onednn``: else (or always) for oneDNN;
    ``row_tiles``: a weight left plain is multiplied in calls of a fixed row count (``row_tiled_linear``).
    """

    def __init__(self, ours: bool = False, onednn: bool = True, row_tiles: bool = False) -> None:
        self.ours, self.onednn, self.row_tiles = ours, onednn, row_tiles

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.weight = nn.Parameter(pack_linear_weight(layer.weight, self.ours, self.onednn), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.row_tiles and layer.weight.dim() == 2:
            return row_tiled_linear(x, layer.weight, bias)
        return packed_linear(x, layer.weight, bias)

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        packed = layer.weight
        if self.row_tiles and packed.dim() == 2:
            return lambda x: row_tiled_linear(x, packed, bias)
        if packed.is_mkldnn:  # not a tagged call: its empty scalar list does not cross into the C++ chain
            onednn = torch.ops.mkldnn._linear_pointwise.default
            return lambda x: onednn(x, packed, bias, "none", [], "")
        if packed.dim() == 4:
            return bound_op_call(torch.ops.folovllm.linear.default, packed, bias)
        return bound_op_call(torch.ops.aten.linear.default, packed, bias)

    def row_table(self, layer: nn.Module) -> nn.Module | None:
        """Our kernel's packed blocks (oneDNN's opaque layout and plain weights keep the embedding's table)."""
        packed = layer.weight
        return PackedRows(packed) if not packed.is_mkldnn and packed.dim() == 4 else None

    def argmax(self, layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        packed = layer.weight
        if packed.is_mkldnn or packed.dim() != 4 or not torch.ops.folovllm.has_kernel("linear_argmax"):
            return None
        op, weight = torch.ops.folovllm.linear_argmax.default, packed.data
        return lambda x: op(x, weight)


def dense_method(kernels: LinearKernels) -> LinearMethod:
    """The method for unquantized weights under the platform's dense kernel choice."""
    if kernels.row_invariant:
        return PackedLinearMethod(ours=kernels.dense == "folovllm", onednn=False, row_tiles=True)
    if kernels.dense == "torch":
        return UnquantizedLinearMethod()
    return PackedLinearMethod(ours=kernels.dense == "folovllm", onednn=kernels.dense_fallback == "onednn"
                              or kernels.dense == "onednn")


def select_linear_methods(quantization: str, quant_config: dict | None,
                          kernels: LinearKernels) -> tuple[LinearMethod, LinearMethod]:
    """(the decoder linears' method, the LM head's): the checkpoint's format, packed for the platform's
    kernels where unquantized; the head (float in every checkpoint) int8 where ``kernels.int8_lm_head``."""
    head: LinearMethod = Int8HeadMethod(kernels.quant) if kernels.int8_lm_head else dense_method(kernels)
    if quantization == UNQUANTIZED:
        return dense_method(kernels), head
    return get_linear_method(quantization, quant_config, kernels), head
