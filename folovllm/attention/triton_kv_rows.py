"""What the Triton attention kernels share about a quantized cache's rows (attention/kv_quant.py): each cache
dtype's format number, and the rows read back as fp32 values."""
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
