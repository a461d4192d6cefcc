"""CUDA's batch-invariant forms: the GEMMs and row reductions of torch's CUDA ops as Triton kernels of fixed
tiles, registered over aten's CUDA kernels while an engine runs batch-invariant (process-wide: every CUDA op of
the process takes them, as vLLM's ``VLLM_BATCH_INVARIANT`` does).

cuBLAS picks a GEMM's algorithm (tile shape, split-K) by the problem's shape, and torch's CUDA reductions size
their thread blocks by the number of rows, so a row's sums move with the rows beside it. Here:

- ``mm``, ``addmm``, ``bmm`` (so ``F.linear`` and ``matmul``): one Triton GEMM of fixed BLOCK_M x BLOCK_N
  tiles walking K in BLOCK_K steps from zero, never split along K; a row's outputs are the same sums whichever
  tile it lands in and however many rows there are (fp32 operands multiplied in IEEE fp32, not TF32);
- ``_softmax``, ``_log_softmax``, ``mean.dim``, ``_fused_rms_norm`` (so ``softmax``, ``log_softmax``, a mean,
  ``F.rms_norm``): one program per row, the row read in chunks of a fixed width, lane sums across chunks then
  one tree over the lanes.

Importing this module imports triton. Kernels compile for CUDA, or run on CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1`` set before triton is imported), which is how the tests rehearse them.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32  # GEMM tiles: fixed, whatever the shape
ROW_CHUNK = 1024  # elements of a row per step of the row kernels
_DOT_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16,
               torch.float64: tl.float64}
_library: torch.library.Library | None = None  # the registered overrides, kept alive; None until enabled


def _interpreted() -> bool:
    return not isinstance(_matmul_kernel, triton.runtime.JITFunction)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                   stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                   stride_cb, stride_cm, stride_cn, stride_biasm, stride_biasn, alpha, beta,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr):
    """c[batch] = alpha * a[batch] @ b[batch] (+ beta * bias): program (m tile, n tile, batch), K from 0 up."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    batch = tl.program_id(2)
    ks = tl.arange(0, BLOCK_K)
    a_rows = a_ptr + batch * stride_ab + rows[:, None] * stride_am
    b_cols = b_ptr + batch * stride_bb + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        a = tl.load(a_rows + k[None, :] * stride_ak, mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_cols + k[:, None] * stride_bk, mask=(k[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc, input_precision=PRECISION, out_dtype=ACC_DTYPE)
    valid = (rows[:, None] < M) & (cols[None, :] < N)
    acc = acc * alpha
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rows[:, None] * stride_biasm + cols[None, :] * stride_biasn, mask=valid, other=0.0)
        acc += beta * bias.to(ACC_DTYPE)
    c = c_ptr + batch * stride_cb + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _row_softmax_kernel(x_ptr, out_ptr, n, stride_x, stride_out, LOG: tl.constexpr, CHUNK: tl.constexpr):
    """One row: its max, then the lanes' sums of exp(x - max) chunk by chunk, one tree over the lanes, then
    exp(x - max) / sum (or x - max - log(sum))."""
    x_row = x_ptr + tl.program_id(0) * stride_x
    out_row = out_ptr + tl.program_id(0) * stride_out
    lanes = tl.arange(0, CHUNK)
    top = tl.full((CHUNK,), float("-inf"), dtype=tl.float32)
    for start in range(0, n, CHUNK):
        top = tl.maximum(top, tl.load(x_row + start + lanes, mask=start + lanes < n, other=float("-inf")).to(tl.float32))
    row_max = tl.max(top, 0)
    sums = tl.zeros((CHUNK,), dtype=tl.float32)
    for start in range(0, n, CHUNK):
        x = tl.load(x_row + start + lanes, mask=start + lanes < n, other=float("-inf")).to(tl.float32)
        sums += tl.exp(x - row_max)
    total = tl.sum(sums, 0)
    for start in range(0, n, CHUNK):
        x = tl.load(x_row + start + lanes, mask=start + lanes < n, other=0.0).to(tl.float32)
        if LOG:
            y = x - row_max - tl.log(total)
        else:
            y = tl.exp(x - row_max) / total
        tl.store(out_row + start + lanes, y.to(out_ptr.dtype.element_ty), mask=start + lanes < n)


@triton.jit
def _row_mean_kernel(x_ptr, out_ptr, n, stride_x, CHUNK: tl.constexpr, ACC_DTYPE: tl.constexpr):
    """One row's mean: lane sums chunk by chunk, one tree over the lanes, divided by n."""
    x_row = x_ptr + tl.program_id(0) * stride_x
    lanes = tl.arange(0, CHUNK)
    sums = tl.zeros((CHUNK,), dtype=ACC_DTYPE)
    for start in range(0, n, CHUNK):
        sums += tl.load(x_row + start + lanes, mask=start + lanes < n, other=0.0).to(ACC_DTYPE)
    tl.store(out_ptr + tl.program_id(0), (tl.sum(sums, 0) / n).to(out_ptr.dtype.element_ty))


@triton.jit
def _row_rms_norm_kernel(x_ptr, w_ptr, out_ptr, rstd_ptr, n, stride_x, stride_out, eps, HAS_WEIGHT: tl.constexpr,
                         CHUNK: tl.constexpr):
    """One row: 1 / sqrt(mean(x^2) + eps) (lane sums chunk by chunk, one tree), then x times it (times w)."""
    x_row = x_ptr + tl.program_id(0) * stride_x
    out_row = out_ptr + tl.program_id(0) * stride_out
    lanes = tl.arange(0, CHUNK)
    sums = tl.zeros((CHUNK,), dtype=tl.float32)
    for start in range(0, n, CHUNK):
        x = tl.load(x_row + start + lanes, mask=start + lanes < n, other=0.0).to(tl.float32)
        sums += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(sums, 0) / n + eps)
    tl.store(rstd_ptr + tl.program_id(0), rstd)
    for start in range(0, n, CHUNK):
        x = tl.load(x_row + start + lanes, mask=start + lanes < n, other=0.0).to(tl.float32)
        y = x * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + start + lanes, mask=start + lanes < n, other=0.0).to(tl.float32)
        tl.store(out_row + start + lanes, y.to(out_ptr.dtype.element_ty), mask=start + lanes < n)


def _acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def batched_matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, alpha: float = 1.0,
                   beta: float = 1.0) -> torch.Tensor:
    """[B, M, K] @ [B, K, N] (+ ``bias`` broadcast to [B, M, N]) with the fixed-tile GEMM."""
    if a.dtype not in _DOT_DTYPES or b.dtype != a.dtype:
        raise TypeError(f"batch-invariant matmul takes float16, bfloat16, float32 or float64 operands of one dtype; "
                        f"got {a.dtype} and {b.dtype}")
    batches, rows, depth = a.shape
    cols = b.shape[2]
    out = torch.empty(batches, rows, cols, dtype=a.dtype, device=a.device)
    if out.numel() == 0:
        return out
    bias_view = bias.expand(batches, rows, cols) if bias is not None else out
    interpreted = _interpreted()
    wide = a.dtype in (torch.float32, torch.float64)
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(cols, BLOCK_N), batches)
    _matmul_kernel[grid](
        a, b, out, bias_view, rows, cols, depth, a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1),
        b.stride(2), out.stride(0), out.stride(1), out.stride(2), bias_view.stride(1), bias_view.stride(2),
        float(alpha), float(beta), HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        # the interpreter multiplies 16-bit floats' bit patterns in tl.dot: it gets fp32 operands instead
        DOT_DTYPE=tl.float32 if interpreted and not wide else _DOT_DTYPES[a.dtype],
        PRECISION="ieee" if wide or interpreted else "tf32", ACC_DTYPE=_acc_dtype(a.dtype))
    return out


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return batched_matmul(a[None], b[None])[0]


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1, alpha: float = 1) -> torch.Tensor:
    return batched_matmul(a[None], b[None], bias.expand(a.shape[0], b.shape[1])[None], alpha, beta)[0]


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return batched_matmul(a, b)


def _rows_last(x: torch.Tensor, dims: list[int]) -> tuple[torch.Tensor, list[int]]:
    """x with ``dims`` moved last and flattened into one: [rows, n], contiguous; and the other dims' sizes."""
    dims = sorted(d % x.dim() for d in dims)
    kept = [d for d in range(x.dim()) if d not in dims]
    moved = x.permute(*kept, *dims).contiguous()
    return moved.view(-1, math.prod(x.shape[d] for d in dims)), [x.shape[d] for d in kept]


def _row_softmax(x: torch.Tensor, dim: int, half_to_float: bool, log: bool) -> torch.Tensor:
    rows, kept = _rows_last(x, [dim])
    out = torch.empty(rows.shape, dtype=torch.float32 if half_to_float else x.dtype, device=x.device)
    if rows.numel():
        _row_softmax_kernel[(rows.shape[0],)](rows, out, rows.shape[1], rows.stride(0), out.stride(0), LOG=log,
                                              CHUNK=ROW_CHUNK)
    return out.view(*kept, x.shape[dim]).movedim(-1, dim).contiguous()


def softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    return _row_softmax(x, dim, half_to_float, log=False)


def log_softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    return _row_softmax(x, dim, half_to_float, log=True)


def mean_dim(x: torch.Tensor, dim: list[int] | None, keepdim: bool = False, *,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    dims = list(range(x.dim())) if not dim else list(dim)
    if dtype is not None:
        x = x.to(dtype)
    rows, kept = _rows_last(x, dims)
    out = torch.empty(rows.shape[0], dtype=x.dtype, device=x.device)
    if rows.shape[1] == 0:  # torch's mean of nothing
        out.fill_(float("nan"))
    elif rows.shape[0]:
        _row_mean_kernel[(rows.shape[0],)](rows, out, rows.shape[1], rows.stride(0), CHUNK=ROW_CHUNK,
                                           ACC_DTYPE=_acc_dtype(x.dtype))
    out = out.view(kept)
    if keepdim:
        for d in sorted(d % x.dim() for d in dims):
            out = out.unsqueeze(d)
    return out


def fused_rms_norm(x: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None,
                   eps: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """aten's ``_fused_rms_norm`` (``F.rms_norm`` on CUDA): (x / rms over the last dims (* weight), 1 / rms)."""
    dims = len(normalized_shape)
    rows = x.contiguous().view(-1, math.prod(normalized_shape))
    out = torch.empty_like(rows)
    rstd = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    if rows.numel():
        _row_rms_norm_kernel[(rows.shape[0],)](
            rows, rows if weight is None else weight.contiguous(), out, rstd, rows.shape[1], rows.stride(0),
            out.stride(0), torch.finfo(x.dtype).eps if eps is None else eps, HAS_WEIGHT=weight is not None,
            CHUNK=ROW_CHUNK)
    return out.view(x.shape), rstd.view(*x.shape[:x.dim() - dims], *[1] * dims)


def enable(dispatch_key: str = "CUDA") -> None:
    """Registers the forms over aten's kernels for ``dispatch_key`` (CUDA; the tests rehearse them on CPU in a
    process of their own); once per process."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    for name, fn in (("mm", mm), ("addmm", addmm), ("bmm", bmm), ("_softmax", softmax),
                     ("_log_softmax", log_softmax), ("mean.dim", mean_dim), ("_fused_rms_norm", fused_rms_norm)):
        library.impl(name, fn, dispatch_key)
    _library = library
