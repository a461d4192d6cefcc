"""The multi-LoRA op as a Triton kernel: ``lora_add`` with the CPU kernel's contract and signature
(csrc/cpu/lora.cpp), the CUDA platform's ``lora_op``.

Each row adds, to its outputs, its own slot's ``B·A·x`` only, one call per linear and step whatever the mix
of adapters; the tables are lora/layers.py's ``kernel_tables``. The delta is summed in fp32 and the output
rounded once to its dtype, as on CPU. A piece's rank is read in the kernel and walked ``RANK_BLOCK`` rows at a
time, so nothing is read back to the host and one compiled kernel serves every rank.

Importing this module imports triton. Kernels compile for CUDA, or run on CPU tensors under Triton's
interpreter when ``TRITON_INTERPRET=1`` is set before this module is first imported (``@triton.jit`` reads
the variable when it decorates).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # outputs per program
BLOCK_K = 64  # inputs per step of a piece's A·x
RANK_BLOCK = 16  # A rows (and B columns) per step over a piece's rank


@triton.jit
def _lora_add_kernel(
    out_ptr, x_ptr, row_slot_ptr, a_ptr, b_ptr, pieces_ptr, p_start_ptr,  # pieces hold absolute A rows
    in_features, out_features, stride_on, stride_xn,  # out [N, O] and x [N, I], unit stride along a row
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RANK_BLOCK: tl.constexpr,
):
    """One program per row and BLOCK_N outputs: the row's slot's pieces that reach these outputs, each
    ``xa = A_piece·x`` then ``xa·Bt`` a rank block at a time, summed in fp32 and added to out once; a row of
    slot -1, and outputs no piece of its slot reaches, are left alone."""
    row = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1) * BLOCK_N
    slot = tl.load(row_slot_ptr + row)
    if slot < 0:
        return
    outputs = tile + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    ranks = tl.arange(0, RANK_BLOCK)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    touched = outputs < 0  # outputs some piece adds to; the others are not written
    for p in range(tl.load(p_start_ptr + slot), tl.load(p_start_ptr + slot + 1)):
        first = tl.load(pieces_ptr + 5 * p)
        rank = tl.load(pieces_ptr + 5 * p + 1) - first
        lo = tl.load(pieces_ptr + 5 * p + 2)
        hi = tl.load(pieces_ptr + 5 * p + 3)
        offset = tl.load(pieces_ptr + 5 * p + 4)
        if (lo < tile + BLOCK_N) & (hi > tile):
            width = hi - lo
            mine = (outputs >= lo) & (outputs < hi)
            for r0 in range(0, rank, RANK_BLOCK):
                rank_valid = r0 + ranks < rank
                a_rows = a_ptr + (first + r0 + ranks)[:, None] * in_features
                xa = tl.zeros((RANK_BLOCK,), dtype=tl.float32)
                for k in range(0, in_features, BLOCK_K):
                    cols = k + ks
                    col_valid = cols < in_features
                    x = tl.load(x_ptr + row * stride_xn + cols, mask=col_valid, other=0.0).to(tl.float32)
                    a = tl.load(a_rows + cols[None, :], mask=rank_valid[:, None] & col_valid[None, :], other=0.0)
                    xa += tl.sum(a * x[None, :], axis=1)
                bt = tl.load(b_ptr + offset + (r0 + ranks)[:, None] * width + (outputs - lo)[None, :],
                             mask=rank_valid[:, None] & mine[None, :], other=0.0)
                acc += tl.sum(xa[:, None] * bt, axis=0)
            touched = touched | mine
    valid = touched & (outputs < out_features)
    old = tl.load(out_ptr + row * stride_on + outputs, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_on + outputs, (old + acc).to(out_ptr.dtype.element_ty), mask=valid)


def lora_add(out: torch.Tensor, x: torch.Tensor, row_slot: torch.Tensor, a: torch.Tensor, a_start: torch.Tensor,
             b: torch.Tensor, pieces: torch.Tensor, p_start: torch.Tensor) -> None:
    """``out[n] += B_s A_s x[n]`` in place for each row n of slot s = row_slot[n] (-1: none), from
    ``kernel_tables``' tables. ``a_start`` is read by nothing here: the pieces name absolute rows of ``a``."""
    if x.dim() != 2 or out.dim() != 2 or x.shape[0] != out.shape[0] or x.dtype != out.dtype:
        raise ValueError(f"lora_add: x [N, in] and out [N, out] of one dtype; got {tuple(x.shape)} {x.dtype}, "
                         f"{tuple(out.shape)} {out.dtype}")
    if a.dtype != torch.float32 or b.dtype != torch.float32 or a.shape[1] != x.shape[1]:
        raise ValueError(f"lora_add: a float32 [rows, {x.shape[1]}] and b float32; got {a.dtype} "
                         f"{tuple(a.shape)}, {b.dtype}")
    if out.stride(-1) != 1:
        raise ValueError("lora_add: out needs unit stride along its rows (it is written in place)")
    rows, out_features = out.shape
    if rows == 0 or out_features == 0 or pieces.shape[0] == 0:
        return
    x = x if x.stride(-1) == 1 else x.contiguous()
    a, b, pieces = a.contiguous(), b.contiguous(), pieces.contiguous()
    grid = (rows, triton.cdiv(out_features, BLOCK_N))
    _lora_add_kernel[grid](
        out, x, row_slot, a, b, pieces, p_start,
        x.shape[1], out_features, out.stride(0), x.stride(0),
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, RANK_BLOCK=RANK_BLOCK,
    )
