"""GGUF weights held as the file has them: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K blocks packed once for our
``gguf_gemm`` kernel (csrc/cpu/gguf_gemm.cpp; the layout: csrc/cpu/gguf_layout.h).

Each type keeps its own codes and its own scales (fp16 d, dmin and m, the sub-block scales and mins as the
integers the file stores): the kernel computes every weight's scale in fp32 as the ``gguf`` package's
dequantize does, so the weights are the file's to the last bit, and a layer holds about the file's bytes
(Q4_K 4.625 bits a weight for the file's 4.5: its six-bit scales a byte each; the others exactly). A
layer's outputs may come in parts of different types (a Q4_K_M file's q and k in Q4_K, v in Q6_K): one
kernel call runs them all.

Outputs in column blocks of 16: a tensor whose rows are not a multiple of 16 is not packed (dequantized
instead). The inputs are whole blocks of the type by the file's own rule.

``pack_gguf`` (numpy) is the layout's readable form; a load packs with the kernel library's ``gguf_pack``
(csrc/cpu/gguf_pack.cpp: the same bytes, threaded) where the library is loaded (``pack_into``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from folovllm import envs
from folovllm.model.quantization.linear_method import LinearMethod, register_bias
from folovllm.model.quantization.op_call import bound_op_call
from folovllm.platforms import kernel_library

BLOCK_COLS = 16  # outputs per column block
ALIGN = 64  # a block's meta area is padded to this many bytes
PACK_BYTES = 512 << 10  # file bytes packed at a time (its work arrays take about 8 times as many)


@dataclass(frozen=True)
class GGUFLayout:
    """A type's packed layout (gguf_layout.h): inputs per file block and per scale, bytes of a column block's
    meta record per file block and of its codes per group."""

    super_k: int
    group_k: int
    meta_bytes: int
    group_code_bytes: int


# by ggml type id (gguf.GGMLQuantizationType), so this module reads no GGUF file and needs no gguf package
Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 8, 12, 13, 14
LAYOUTS = {
    Q4_0: GGUFLayout(32, 32, 32, 256),
    Q4_1: GGUFLayout(32, 32, 64, 256),
    Q8_0: GGUFLayout(32, 32, 32, 512),
    Q4_K: GGUFLayout(256, 32, 320, 256),
    Q5_K: GGUFLayout(256, 32, 320, 320),
    Q6_K: GGUFLayout(256, 16, 288, 192),
}
# file bytes per block of each type: (weights, bytes)
FILE_BLOCKS = {Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}


def packable(qtype: int, rows: int, cols: int) -> bool:
    """Whether a [rows x cols] tensor of ggml type ``qtype`` is held packed for our kernel."""
    layout = LAYOUTS.get(int(qtype))
    return layout is not None and rows > 0 and rows % BLOCK_COLS == 0 and cols > 0 and cols % layout.super_k == 0


def meta_area(layout: GGUFLayout, cols: int) -> int:
    return -(-(cols // layout.super_k * layout.meta_bytes) // ALIGN) * ALIGN


def block_bytes(layout: GGUFLayout, cols: int) -> int:
    return meta_area(layout, cols) + cols // layout.group_k * layout.group_code_bytes


def packed_bytes(qtype: int, rows: int, cols: int) -> int:
    """Bytes a [rows x cols] tensor of ``qtype`` takes packed."""
    return rows // BLOCK_COLS * block_bytes(LAYOUTS[int(qtype)], cols)


def _per_block(values: np.ndarray, rows: int) -> np.ndarray:
    """[rows, units, *item] -> [rows / 16, units, 16 outputs, *item]: each column block's outputs side by side."""
    v = values.reshape(rows // BLOCK_COLS, BLOCK_COLS, *values.shape[1:])
    return np.moveaxis(v, 1, 2)


def _words(bits: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """bits [..., *shifts.shape] small unsigned fields -> uint32 [...]: each shifted by its shift, or-ed."""
    fields = bits.astype(np.uint32) << shifts.astype(np.uint32)
    return np.bitwise_or.reduce(fields.reshape(*bits.shape[:bits.ndim - shifts.ndim], -1), axis=-1)


def _low_chunks(codes: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """codes [rows, cols] -> uint32 [rows / 16, cols / 8, 16]: lane j of chunk c holds output j's low nibbles of
    codes 8c + 2p at bits 4p and 8c + 2p + 1 at 16 + 4p."""
    nibbles = (codes & 15).reshape(rows, cols // 8, 4, 2)
    shifts = 4 * np.arange(4).reshape(4, 1) + np.array([0, 16]).reshape(1, 2)
    return _per_block(_words(nibbles, shifts), rows)


def _high_words(high: np.ndarray, rows: int, cols: int, group: int, width: int) -> np.ndarray:
    """high bits [rows, cols] (``width`` bits each) -> uint32 [rows / 16, cols / group, 16]: per group of
    ``group`` codes, chunk c's pair p at bit width (4c + p) (even code) and 16 + width (4c + p) (odd)."""
    fields = high.reshape(rows, cols // group, group // 8, 4, 2)
    c, p = np.arange(group // 8).reshape(-1, 1, 1), np.arange(4).reshape(1, 4, 1)
    shifts = width * (4 * c + p) + np.array([0, 16]).reshape(1, 1, 2)
    return _per_block(_words(fields, shifts), rows)


def _fp16_bytes(raw: np.ndarray, rows: int) -> np.ndarray:
    """[rows, units, 2] fp16 bytes -> [rows / 16, units, 32]: 16 outputs' values side by side per unit."""
    return _per_block(raw, rows).reshape(rows // BLOCK_COLS, raw.shape[1], -1)


def _unpack_k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes of six-bit scales and mins -> (sc, m), uint8 [..., 8] each (the file's packing)."""
    s = scales.reshape(*scales.shape[:-1], 3, 4)
    d, m, md = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def pack_gguf(data: np.ndarray, qtype: int, rows: int, cols: int, out: np.ndarray | None = None) -> np.ndarray:
    """A GGUF tensor's blocks (uint8, [rows, bytes per row] as the file stores them) -> the packed layout,
    uint8 [packed_bytes(qtype, rows, cols)], written into ``out`` where given. A few column blocks at a time,
    so the work arrays stay small (a file's tensors are read as they are mapped, never copied whole)."""
    qtype = int(qtype)
    if not packable(qtype, rows, cols):
        raise ValueError(f"a [{rows} x {cols}] tensor of ggml type {qtype} cannot be held packed")
    size = packed_bytes(qtype, rows, cols)
    out = np.empty(size, np.uint8) if out is None else out
    if out.shape != (size,) or out.dtype != np.uint8:
        raise ValueError(f"out must be uint8 [{size}], got {out.dtype} {list(out.shape)}")
    step = max(BLOCK_COLS, PACK_BYTES // max(data.shape[1] * 8, 1) // BLOCK_COLS * BLOCK_COLS)
    per_row = size // rows
    for first in range(0, rows, step):
        last = min(rows, first + step)
        out[first * per_row:last * per_row] = _pack_rows(data[first:last], qtype, last - first, cols)
    return out


def pack_into(data: torch.Tensor, qtype: int, cols: int, out: torch.Tensor) -> None:
    """``pack_gguf`` of a tensor's file blocks (uint8 [rows, bytes per row]) into ``out`` (uint8
    [packed_bytes]): by the kernel library's ``gguf_pack`` where it is loaded and ``FOLOVLLM_GGUF_FAST_LOAD``
    is on, else numpy's ``pack_gguf``; the same bytes either way."""
    if envs.switch("FOLOVLLM_GGUF_FAST_LOAD") and kernel_library.load() is None:
        torch.ops.folovllm.gguf_pack(out, data, qtype, cols)
    else:
        pack_gguf(data.numpy(), qtype, data.shape[0], cols, out=out.numpy())


def _pack_rows(data: np.ndarray, qtype: int, rows: int, cols: int) -> np.ndarray:
    """``pack_gguf`` of ``rows`` rows (a multiple of 16)."""
    layout = LAYOUTS[qtype]
    weights, size = FILE_BLOCKS[qtype]
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(rows, cols // weights, size)
    if qtype in (Q4_0, Q4_1, Q8_0):
        meta = _fp16_bytes(blocks[:, :, 0:2], rows)
        if qtype == Q4_1:
            meta = np.concatenate([meta, _fp16_bytes(blocks[:, :, 2:4], rows)], axis=-1)
        if qtype == Q8_0:
            q = blocks[:, :, 2:].reshape(rows, cols // 2, 2)  # int8 codes, as bytes
            codes = _per_block(q, rows).reshape(rows // BLOCK_COLS, -1)
        else:  # 16 bytes of nibbles: the block's first 16 codes low, the next 16 high
            qs = blocks[:, :, size - 16:].reshape(rows, -1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
            codes = _low_chunks((qs & 15).reshape(rows, cols), rows, cols).reshape(rows // BLOCK_COLS, -1)
    elif qtype in (Q4_K, Q5_K):
        sc, mn = _unpack_k_scales(blocks[:, :, 4:16])
        meta = np.concatenate([_fp16_bytes(blocks[:, :, 0:2], rows), _fp16_bytes(blocks[:, :, 2:4], rows),
                               _per_block(sc, rows).swapaxes(-1, -2).reshape(rows // BLOCK_COLS, cols // 256, -1),
                               _per_block(mn, rows).swapaxes(-1, -2).reshape(rows // BLOCK_COLS, cols // 256, -1)],
                              axis=-1)
        qs = blocks[:, :, size - 128:].reshape(rows, -1, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        low = _low_chunks((qs & 15).reshape(rows, cols), rows, cols)
        if qtype == Q4_K:
            codes = low.reshape(rows // BLOCK_COLS, -1)
        else:  # the fifth bits: bit j of byte i of a block's 32 is code 32 j + i's
            qh = blocks[:, :, 16:48].reshape(rows, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
            high = _high_words((qh & 1).reshape(rows, cols), rows, cols, 32, 1)
            codes = np.concatenate([low.reshape(rows // BLOCK_COLS, cols // 32, -1), high], axis=-1)
            codes = codes.reshape(rows // BLOCK_COLS, -1)
    else:  # Q6_K: 128 bytes of low nibbles, 64 of high pairs, 16 int8 scales, fp16 d
        sc = blocks[:, :, 192:208]
        meta = np.concatenate([_fp16_bytes(blocks[:, :, 208:210], rows),
                               _per_block(sc, rows).swapaxes(-1, -2).reshape(rows // BLOCK_COLS, cols // 256, -1)],
                              axis=-1)
        ql = blocks[:, :, :128].reshape(rows, -1, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        qh = blocks[:, :, 128:192].reshape(rows, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
        low = _low_chunks((ql & 15).reshape(rows, cols), rows, cols)
        high = _high_words((qh & 3).reshape(rows, cols), rows, cols, 16, 2)
        codes = np.concatenate([low.reshape(rows // BLOCK_COLS, cols // 16, -1), high], axis=-1)
        codes = codes.reshape(rows // BLOCK_COLS, -1)
    meta = np.ascontiguousarray(meta).view(np.uint8).reshape(rows // BLOCK_COLS, -1)
    padding = meta_area(layout, cols) - meta.shape[1]
    out = np.concatenate([meta, np.zeros((rows // BLOCK_COLS, padding), np.uint8),
                          np.ascontiguousarray(codes).view(np.uint8).reshape(rows // BLOCK_COLS, -1)], axis=1)
    return out.reshape(-1)


class GGUFWeight(nn.Module):
    """One packed weight [sum of the pieces' rows, cols]: buffers ``weight`` (the pieces' packed bytes, in
    order) and ``parts`` (int64 [P, 4]: ggml type, rows, byte offset, cols; the op's table).

    Until loaded, each piece is a parameter ``piece<i>`` viewing its bytes, whose loader packs the file's
    blocks ([rows, bytes per row]) into them; once every piece is in, those views are dropped.
    """

    def __init__(self, pieces: list[tuple[int, int]], cols: int, device: torch.device | str = "cpu") -> None:
        super().__init__()
        for qtype, rows in pieces:
            if not packable(qtype, rows, cols):
                raise ValueError(f"a [{rows} x {cols}] piece of ggml type {qtype} cannot be held packed")
        sizes = [packed_bytes(qtype, rows, cols) for qtype, rows in pieces]
        offsets = np.cumsum([0, *sizes])
        self.cols, self.pieces = cols, list(pieces)
        self.register_buffer("weight", torch.empty(int(offsets[-1]), dtype=torch.uint8, device=device))
        self.register_buffer("parts", torch.tensor([[int(q), rows, int(o), cols] for (q, rows), o in
                                                    zip(pieces, offsets)], dtype=torch.int64, device=device))
        self._waiting = set()
        for i, ((qtype, rows), offset, size) in enumerate(zip(pieces, offsets, sizes)):
            piece = nn.Parameter(self.weight[int(offset):int(offset) + size], requires_grad=False)
            piece.weight_loader = functools.partial(self._load_piece, i)
            self.register_parameter(f"piece{i}", piece)
            self._waiting.add(i)

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.pieces)

    def _load_piece(self, index: int, param: nn.Parameter, loaded: torch.Tensor) -> None:
        qtype, rows = self.pieces[index]
        expected = (rows, self.cols // FILE_BLOCKS[qtype][0] * FILE_BLOCKS[qtype][1])
        if loaded.dtype != torch.uint8 or tuple(loaded.shape) != expected:
            raise ValueError(f"has {loaded.dtype} {tuple(loaded.shape)}; its packed piece takes the file's "
                             f"blocks, uint8 {expected}")
        pack_into(loaded, qtype, self.cols, param.data)
        self._waiting.discard(index)
        if not self._waiting:  # every piece in: the bytes are the buffer's alone
            for i in range(len(self.pieces)):
                delattr(self, f"piece{i}")

    def matmul_op(self, a8_rows: int = 0) -> tuple[Any, ...]:
        """The op that multiplies by W and its arguments after x: ``gguf_gemm_a8`` where ``a8_rows`` is set (Q4_K
        and Q6_K parts' bf16 rows rounded to int8 from this many rows on, on a VNNI CPU), else ``gguf_gemm``."""
        if a8_rows:
            return torch.ops.folovllm.gguf_gemm_a8.default, self.weight, self.parts, a8_rows
        return torch.ops.folovllm.gguf_gemm.default, self.weight, self.parts

    def matmul(self, x: torch.Tensor, a8_rows: int = 0) -> torch.Tensor:
        """x [..., cols] -> x W^T [..., rows] in x's dtype (``matmul_op``'s op)."""
        op, *args = self.matmul_op(a8_rows)
        return op(x, *args)

    def rows_of(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` of W (one piece: an embedding table) dequantized, each value the file's."""
        return torch.ops.folovllm.gguf_rows(self.weight, self.parts, ids, dtype)


class GGUFPackedLinearMethod(LinearMethod):
    """A linear whose every checkpoint piece is a packable GGUF tensor: ``pieces`` (ggml type, rows) in the
    layer's output order. Holds a ``GGUFWeight`` as ``layer.gguf`` (or multiplies by ``shared``, a table
    another module holds: a head tied to a packed embedding); one ``gguf_gemm`` call per forward (``gguf_gemm_a8``
    from ``a8_rows`` rows on: the platform's ``LinearKernels.gguf_a8_rows``, 0 never)."""

    def __init__(self, pieces: list[tuple[int, int]], shared: GGUFWeight | None = None, a8_rows: int = 0) -> None:
        self.pieces, self.shared, self.a8_rows = pieces, shared, a8_rows

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, bias: bool, dtype: torch.dtype,
                       device: torch.device) -> None:
        if sum(rows for _, rows in self.pieces) != output_size:
            raise ValueError(f"GGUF pieces of {[rows for _, rows in self.pieces]} rows do not make a linear of "
                             f"{output_size} outputs")
        if self.shared is None:
            layer.gguf = GGUFWeight(self.pieces, input_size, device)
        register_bias(layer, bias, output_size, dtype, device)

    def table(self, layer: nn.Module) -> GGUFWeight:
        return self.shared if self.shared is not None else layer.gguf

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = self.table(layer).matmul(x, self.a8_rows)
        return y if bias is None else y + bias

    def bind(self, layer: nn.Module, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        table = self.table(layer)
        if bias is None:
            return bound_op_call(*table.matmul_op(self.a8_rows))
        return lambda x: table.matmul(x, self.a8_rows) + bias

    def argmax(self, layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A head's greedy tokens: ``gguf_argmax`` (for bf16 rows each row's best kept inside the matmul's loop,
        the logits never written; the argmax of ``apply``'s logits, int8 activations where it takes them)."""
        table = self.table(layer)
        op, weight, parts, a8_rows = torch.ops.folovllm.gguf_argmax.default, table.weight, table.parts, self.a8_rows
        return lambda x: op(x, weight, parts, a8_rows)
