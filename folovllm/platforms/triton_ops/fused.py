"""A decoder layer's element-wise ops as Triton kernels: the CUDA platform's kernel forms of ``RMSNorm``,
``Attention`` (q/k norm + rotary + the paged K/V store) and ``GatedMLP`` (SiLU-mul), with the C++ library's
signatures (``KernelOps``).

Each rounds where the torch form rounds: every intermediate a torch op would hand back in the model's dtype is
rounded to it here too, products and sums are not contracted into FMAs (``enable_fp_fusion=False``), divisions
and square roots are correctly rounded (``div_rn``, ``sqrt_rn``) and, compiled, ``exp`` is libdevice's (CUDA's
``expf``, which torch's SiLU calls). So rotary and the K/V rows (bf16, or int8/fp8 codes and their scale) are
the torch form's bits; a norm differs only where its sum of squares is added in another order; SiLU-mul at most
by exp's last ulp (under the interpreter numpy's exp).

Grids come from tensor shapes alone and lengths from device tensors, so each launch captures in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

_KV_FORMATS = {torch.int8: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}  # attention/kv_quant.py's formats
_MIN_SCALE = 2.0**-14  # attention/kv_quant.py's MIN_SCALE: float16's smallest normal
_SILU_BLOCK = 1024


def _interpreted() -> bool:
    return not isinstance(_norm_kernel, triton.runtime.JITFunction)


def _num_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


@triton.jit
def _rounded(x, DTYPE: tl.constexpr):
    """x as a torch op in DTYPE would hand it back: rounded to DTYPE (to nearest, ties to even), then widened
    again. bf16 is rounded on the bits (a later ``.to(bfloat16)`` is then exact): Triton 3.6's interpreter
    truncates that cast instead of rounding it."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def _inv_rms(x, count, eps):
    """1 / sqrt(mean(x^2) + eps) over the valid (zero padded) values x, ``count`` (a float) of them."""
    return tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(x * x, axis=0), count) + eps))


@triton.jit
def _norm_kernel(res_ptr, x_ptr, w_ptr, out_ptr, stride_res, stride_x, stride_out, n, eps,
                 ADD: tl.constexpr, BLOCK: tl.constexpr):
    """One row: (ADD) residual += x, rounded once, then out = T(T(row * inv_rms) * weight) (HF's order)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        total = x + tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        x = _rounded(total, dtype)
        tl.store(res_ptr + row * stride_res + cols, x.to(dtype), mask=mask)
    normed = _rounded(x * _inv_rms(x, n.to(tl.float32), eps), dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, _rounded(normed * w, dtype).to(dtype), mask=mask)


def _norm(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, add: bool) -> torch.Tensor:
    n = weight.numel()
    if x.shape[-1] != n or x.stride(-1) != 1 or residual.stride(-1) != 1 or x.dtype != weight.dtype:
        raise ValueError(f"rms_norm: rows of {n} values with unit stride, in the weight's dtype; got "
                         f"{tuple(x.shape)} {x.dtype} (weight {weight.dtype})")
    rows_x, rows_res = x.reshape(-1, n), residual.reshape(-1, n)  # views where the rows are evenly spaced
    if add and rows_res.data_ptr() != residual.data_ptr():
        raise ValueError("add_rms_norm: the residual is written in place, so its rows must be evenly spaced")
    out = torch.empty(rows_x.shape, dtype=x.dtype, device=x.device)
    if rows_x.shape[0]:
        block = triton.next_power_of_2(n)
        _norm_kernel[(rows_x.shape[0],)](rows_res, rows_x, weight, out, rows_res.stride(0), rows_x.stride(0),
                                         out.stride(0), n, eps, ADD=add, BLOCK=block, num_warps=_num_warps(block),
                                         enable_fp_fusion=False)
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) * weight per row of the last dim, in x's dtype."""
    return _norm(x, x, weight, eps, add=False)


def add_rms_norm(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``residual += x`` (in place, rounded once as ``x + residual``), then RMSNorm(residual) * weight."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"add_rms_norm: residual {tuple(residual.shape)} {residual.dtype} and x "
                         f"{tuple(x.shape)} {x.dtype} must match")
    return _norm(residual, x, weight, eps, add=True)


@triton.jit
def _silu_mul_kernel(in_ptr, out_ptr, stride_in, stride_out, width, BLOCK: tl.constexpr, PRECISE: tl.constexpr):
    """out = T(T(silu(gate)) * up) for BLOCK columns of one row of [gate | up]; silu(g) = g / (1 + exp(-g))."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(in_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(in_ptr + row * stride_in + width + cols, mask=mask, other=0.0).to(tl.float32)
    if PRECISE:
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    silu = _rounded(tl.math.div_rn(gate, 1.0 + e), dtype)
    tl.store(out_ptr + row * stride_out + cols, _rounded(silu * up, dtype).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2 I] merged [gate | up] -> silu(gate) * up [..., I]."""
    if gate_up.shape[-1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"silu_and_mul: an even last dim with unit stride, [gate | up]; got {tuple(gate_up.shape)}")
    width = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * width)
    out = torch.empty(rows.shape[0], width, dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0] and width:
        _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, _SILU_BLOCK))](
            rows, out, rows.stride(0), out.stride(0), width, BLOCK=_SILU_BLOCK, PRECISE=not _interpreted(),
            enable_fp_fusion=False)
    return out.view(*gate_up.shape[:-1], width)


@triton.jit
def _store_quantized_row(cache_ptr, base, values, dims, valid, HEAD_DIM: tl.constexpr, KV_FORMAT: tl.constexpr,
                         MIN_SCALE: tl.constexpr):
    """One K or V row quantized as attention/kv_quant.py's ``quantize_rows`` does, bit for bit: scale = absmax /
    the format's largest code (at least 2^-14), rounded to float16; codes = values / scale clamped to that range
    and rounded to nearest even (int8), or converted as c10's float -> fp8 conversion (e4m3fn, e5m2) does; the
    codes, then the scale's two bytes."""
    if KV_FORMAT == 1:
        max_code = 127.0
    elif KV_FORMAT == 2:
        max_code = 448.0
    else:
        max_code = 57344.0
    absmax = tl.max(tl.where(valid, tl.abs(values), 0.0), axis=0)
    scale16 = tl.maximum(tl.math.div_rn(absmax, max_code), MIN_SCALE).to(tl.float16)
    scale = scale16.to(tl.float32)
    scaled = tl.minimum(tl.maximum(tl.math.div_rn(values, scale), -max_code), max_code)
    if KV_FORMAT == 1:  # 1.5 * 2^23 added and taken away: the float rounded to an integer, half to even
        codes = ((scaled + 12582912.0) - 12582912.0).to(tl.int32) & 0xFF
    else:
        bits = scaled.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        magnitude = bits & 0x7FFFFFFF
        if KV_FORMAT == 2:  # e4m3fn: below 2^-6 subnormal steps of 2^-9 (the ulp of 2^14), else 3 mantissa bits
            small = ((magnitude.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - (141 << 23))
            large = (magnitude + 0x7FFFF + ((magnitude >> 20) & 1) - (120 << 23)) >> 20
            codes = tl.where(magnitude < (121 << 23), small, large) | sign
        else:  # e5m2: below 2^-14 subnormal steps of 2^-16 (the ulp of 2^7), else 2 mantissa bits
            small = ((magnitude.to(tl.float32, bitcast=True) + 128.0).to(tl.int32, bitcast=True) - (134 << 23))
            large = (magnitude + 0xFFFFF + ((magnitude >> 21) & 1) - (112 << 23)) >> 21
            codes = tl.where(magnitude < (113 << 23), small, large) | sign
    tl.store(cache_ptr + base + dims, codes.to(tl.uint8), mask=valid)
    scale_bits = scale16.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    tl.store(cache_ptr + base + HEAD_DIM, (scale_bits & 0xFF).to(tl.uint8))
    tl.store(cache_ptr + base + HEAD_DIM + 1, (scale_bits >> 8).to(tl.uint8))


@triton.jit
def _rotary_store_kv_kernel(
    qkv_ptr, cos_ptr, sin_ptr, q_weight_ptr, k_weight_ptr, q_out_ptr, k_out_ptr, k_cache_ptr, v_cache_ptr,
    slot_ptr, stride_t, stride_rope, stride_cb, stride_cs, stride_ch, eps,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, HAS_NORM: tl.constexpr, KV_FORMAT: tl.constexpr, MIN_SCALE: tl.constexpr,
):
    """Program (token, head) over the q heads, then the k heads: the head's row (RMSNorm'd first with HAS_NORM),
    rotated as ``x * cos + [x2, x1] * (-sin | sin)`` with torch's roundings; a k head also stores its rotated
    row and its token's v row of that head at the token's cache slot (slot < 0: nothing)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dims = tl.arange(0, DIM_PAD)
    valid = dims < HEAD_DIM
    half: tl.constexpr = HEAD_DIM // 2
    other = tl.where(dims < half, dims + half, dims - half)  # the partner each value is rotated with
    dtype = q_out_ptr.dtype.element_ty
    row = qkv_ptr + token * stride_t + head * HEAD_DIM
    x = tl.load(row + dims, mask=valid, other=0.0).to(tl.float32)
    x_other = tl.load(row + other, mask=valid, other=0.0).to(tl.float32)
    is_q = head < NUM_HEADS
    if HAS_NORM:
        inv = _inv_rms(x, HEAD_DIM * 1.0, eps)
        w = (tl.load(q_weight_ptr + dims, mask=valid & is_q, other=0.0).to(tl.float32)
             + tl.load(k_weight_ptr + dims, mask=valid & (head >= NUM_HEADS), other=0.0).to(tl.float32))
        w_other = (tl.load(q_weight_ptr + other, mask=valid & is_q, other=0.0).to(tl.float32)
                   + tl.load(k_weight_ptr + other, mask=valid & (head >= NUM_HEADS), other=0.0).to(tl.float32))
        x = _rounded(_rounded(x * inv, dtype) * w, dtype)
        x_other = _rounded(_rounded(x_other * inv, dtype) * w_other, dtype)
    cos = tl.load(cos_ptr + token * stride_rope + dims, mask=valid, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * stride_rope + dims, mask=valid, other=0.0).to(tl.float32)
    rotated = _rounded(_rounded(x * cos, dtype) + _rounded(x_other * sin, dtype), dtype).to(dtype)
    if is_q:
        tl.store(q_out_ptr + (token * NUM_HEADS + head) * HEAD_DIM + dims, rotated, mask=valid)
    else:
        kv_head = head - NUM_HEADS
        tl.store(k_out_ptr + (token * NUM_KV_HEADS + kv_head) * HEAD_DIM + dims, rotated, mask=valid)
        slot = tl.load(slot_ptr + token)
        if slot >= 0:
            base = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
            v_row = qkv_ptr + token * stride_t + (NUM_HEADS + NUM_KV_HEADS + kv_head) * HEAD_DIM
            v = tl.load(v_row + dims, mask=valid, other=0.0)
            if KV_FORMAT == 0:
                tl.store(k_cache_ptr + base + dims, rotated, mask=valid)
                tl.store(v_cache_ptr + base + dims, v, mask=valid)
            else:
                _store_quantized_row(k_cache_ptr, base, rotated.to(tl.float32), dims, valid, HEAD_DIM, KV_FORMAT,
                                     MIN_SCALE)
                _store_quantized_row(v_cache_ptr, base, v.to(tl.float32), dims, valid, HEAD_DIM, KV_FORMAT,
                                     MIN_SCALE)


def rotary_store_kv(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, slot_mapping: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (Hq + 2 Hkv) D] (rows may be strided) -> (q [T, Hq, D], k [T, Hkv, D], v view [T, Hkv, D]): q and
    k per-head RMSNorm'd (with weights given) and rotated by cos / sign-folded sin ([T, D] or [T, 1, D]); k and v
    stored at ``slot_mapping[t]`` of the caches [num_blocks, block_size, Hkv, D] (or their int8/fp8 rows of
    D codes and a float16 scale, attention/kv_quant.py); slot -1 stores nothing."""
    kv_format = _KV_FORMATS.get(k_cache.dtype, 0)
    tokens = qkv.shape[0]
    head_dim = k_cache.shape[3] - (2 if kv_format else 0)
    if qkv.dim() != 2 or qkv.stride(1) != 1 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"rotary_store_kv: qkv must be [T, (Hq + 2 Hkv) * head_dim] with contiguous rows; got "
                         f"{tuple(qkv.shape)} for {num_heads} + 2 x {num_kv_heads} heads of {head_dim}")
    if (head_dim % 2 or k_cache.shape[2] != num_kv_heads or k_cache.stride() != v_cache.stride()
            or k_cache.stride(3) != 1):
        raise ValueError("rotary_store_kv: caches [num_blocks, block_size, Hkv, D] of one layout, an even head_dim")
    if cos.shape != sin.shape or cos.stride() != sin.stride() or cos.stride(-1) != 1 or cos.shape[-1] != head_dim:
        raise ValueError("rotary_store_kv: cos and sin must be [T, head_dim] or [T, 1, head_dim] of one layout")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("rotary_store_kv: q and k norm weights come together")
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(tokens, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    v = qkv.narrow(1, (num_heads + num_kv_heads) * head_dim, num_kv_heads * head_dim).view(
        tokens, num_kv_heads, head_dim)
    if tokens == 0:
        return q, k, v
    if kv_format:  # quantized rows are written as bytes
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    norm = q_weight is not None
    _rotary_store_kv_kernel[(tokens, num_heads + num_kv_heads)](
        qkv, cos, sin, q_weight if norm else qkv, k_weight if norm else qkv, q, k, k_cache, v_cache, slot_mapping,
        qkv.stride(0), cos.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), eps,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1], HAS_NORM=norm, KV_FORMAT=kv_format, MIN_SCALE=_MIN_SCALE,
        enable_fp_fusion=False)
    return q, k, v
