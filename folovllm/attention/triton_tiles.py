"""What the Triton attention kernels share: a quantized cache's rows (attention/kv_quant.py) read back as fp32
values, and one tile of keys attended (the online softmax's step)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# KV_FORMAT of a cache (attention/kv_quant.py's rows): 0 the query's dtype, else its one-byte codes' format
KV_FORMATS = {torch.int8: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}


@triton.jit
def dequantized_rows(cache_ptr, row_offset, dims, valid, HEAD_DIM: tl.constexpr, KV_FORMAT: tl.constexpr):
    """[N, D] fp32 values of N quantized rows at byte offsets ``row_offset``: each code (int8, or an fp8's
    bits moved into fp32's place, its exponent bias made up by a power of two) times the row's float16 scale."""
    codes = tl.load(cache_ptr + row_offset[:, None] + dims[None, :], mask=valid[:, None], other=0).to(tl.uint32)
    low = tl.load(cache_ptr + row_offset + HEAD_DIM, mask=valid, other=0).to(tl.uint32)
    high = tl.load(cache_ptr + row_offset + HEAD_DIM + 1, mask=valid, other=0).to(tl.uint32)
    # float16 bits -> fp32: 13 bits up, bias 15 -> 127 is 2^112 (scales are normal float16s)
    scale = (((low | (high << 8)) & 0x7FFF) << 13).to(tl.float32, bitcast=True) * 5.192296858534828e33
    if KV_FORMAT == 1:
        values = codes.to(tl.int32) - ((codes & 0x80) << 1).to(tl.int32)  # the byte as two's complement
        values = values.to(tl.float32)
    elif KV_FORMAT == 2:  # e4m3: bias 7, 3 mantissa bits -> 2^120
        bits = ((codes & 0x7F) << 20) | ((codes & 0x80) << 24)
        values = bits.to(tl.float32, bitcast=True) * 1.329227995784916e36
    else:  # e5m2: bias 15, 2 mantissa bits -> 2^112
        bits = ((codes & 0x7F) << 21) | ((codes & 0x80) << 24)
        values = bits.to(tl.float32, bitcast=True) * 5.192296858534828e33
    return values * scale[:, None]


@triton.jit
def attend_tile(q, m, l, acc, key_start, kv_end, q_pos, block_table, k_cache_ptr, v_cache_ptr, kv_head, dims,
                scale_log2, sliding_window, stride_cb, stride_cs, stride_ch, P_DTYPE: tl.constexpr,
                BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr,
                DOT_PRECISION: tl.constexpr, KV_FORMAT: tl.constexpr):
    """The keys ``key_start .. key_start + BLOCK_N`` (before ``kv_end``) of one KV head, looked up in the block
    table, attended by the query rows at positions ``q_pos`` (each sees keys up to its position and within its
    window): the running max ``m``, sum ``l`` and unnormalized output ``acc`` updated (scores in log2 units)."""
    key_pos = key_start + tl.arange(0, BLOCK_N)
    key_valid = key_pos < kv_end
    block = tl.load(block_table + key_pos // BLOCK_SIZE, mask=key_valid, other=0)
    kv_offset = block * stride_cb + (key_pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
    if KV_FORMAT == 0:
        k_t = tl.load(k_cache_ptr + kv_offset[None, :] + dims[:, None], mask=key_valid[None, :], other=0.0)
    else:
        k_t = tl.trans(dequantized_rows(k_cache_ptr, kv_offset, dims, key_valid, HEAD_DIM, KV_FORMAT))
    scores = tl.dot(q, k_t.to(DOT_DTYPE), input_precision=DOT_PRECISION) * scale_log2
    visible = key_valid[None, :] & (key_pos[None, :] <= q_pos[:, None])
    visible = visible & (key_pos[None, :] > q_pos[:, None] - sliding_window)
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    if KV_FORMAT == 0:
        v = tl.load(v_cache_ptr + kv_offset[:, None] + dims[None, :], mask=key_valid[:, None], other=0.0)
    else:
        v = dequantized_rows(v_cache_ptr, kv_offset, dims, key_valid, HEAD_DIM, KV_FORMAT)
    p = p.to(P_DTYPE).to(DOT_DTYPE)  # probabilities rounded to the input dtype, as on the GPU
    acc = acc * alpha[:, None] + tl.dot(p, v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    return m_new, l, acc
