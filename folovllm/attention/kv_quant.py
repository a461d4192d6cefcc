"""A quantized paged KV cache: int8 or fp8 codes with one scale per token and KV head, stored in the block.

Each cache row (one token's K or V for one KV head) holds ``head_dim`` one-byte codes followed by its
scale as two bytes of float16: ``[num_blocks, block_size, num_kv_heads, head_dim + 2]`` in the code dtype
(int8, float8_e4m3fn, float8_e5m2). A row's value is ``code * scale`` with the scale set from the row's
largest magnitude when the row is written (at least 2^-14) (int8: llama.cpp's q8_0 class, its 32-value group here one
head's ``head_dim`` values; fp8: the row scaled onto the format's range). The scales live in the rows,
so whatever moves whole blocks (prefix caching, PD transfer) moves them too; a row is written once, so
no scale ever changes under rows quantized before it. This module is the reference the C++ kernels match
(csrc/cpu/kv_quant.h).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_BYTES = 2  # the row's float16 scale
MIN_SCALE = 2.0**-14


@dataclass(frozen=True)
class KVCacheFormat:
    """How a ``--kv-cache-dtype`` stores a row: its code dtype and the largest code magnitude."""

    name: str
    code_dtype: torch.dtype
    max_code: float


KV_CACHE_FORMATS = {
    "int8": KVCacheFormat("int8", torch.int8, 127.0),
    "fp8_e4m3": KVCacheFormat("fp8_e4m3", torch.float8_e4m3fn, 448.0),
    "fp8_e5m2": KVCacheFormat("fp8_e5m2", torch.float8_e5m2, 57344.0),
}
KV_CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}  # vLLM's fp8 is e4m3
_BY_CODE_DTYPE = {f.code_dtype: f for f in KV_CACHE_FORMATS.values()}


def kv_cache_format(kv_cache_dtype: str) -> KVCacheFormat | None:
    """The format a ``kv_cache_dtype`` names; None for ``auto`` (rows in the model's dtype)."""
    name = KV_CACHE_DTYPE_ALIASES.get(kv_cache_dtype, kv_cache_dtype)
    if name == "auto":
        return None
    if name not in KV_CACHE_FORMATS:
        raise ValueError(f"kv_cache_dtype must be auto, fp8, {', '.join(KV_CACHE_FORMATS)}; got {kv_cache_dtype!r}")
    return KV_CACHE_FORMATS[name]


def check_backend_takes(backend: object, name: str, fmt: KVCacheFormat | None) -> None:
    """ValueError at start-up when a quantized cache is asked of a backend that cannot read one."""
    if fmt is not None and not getattr(backend, "takes_quantized_kv", False):
        raise ValueError(f"attention_backend {name!r} cannot read a {fmt.name} KV cache; use kv_cache_dtype "
                         "'auto' or attention_backend 'torch' (or 'cpu' on a CPU)")


def cache_row_shape(head_dim: int, fmt: KVCacheFormat | None) -> int:
    """Elements in one cache row: ``head_dim``, plus the scale's bytes for a quantized format."""
    return head_dim if fmt is None else head_dim + SCALE_BYTES


def cache_element_dtype(model_dtype: torch.dtype, fmt: KVCacheFormat | None) -> torch.dtype:
    return model_dtype if fmt is None else fmt.code_dtype


def quantized_format(cache: torch.Tensor) -> KVCacheFormat | None:
    """The format of a cache tensor (from its dtype); None for a cache in the model's dtype."""
    return _BY_CODE_DTYPE.get(cache.dtype)


def quantize_rows(x: torch.Tensor, fmt: KVCacheFormat) -> torch.Tensor:
    """``[..., D]`` floats -> ``[..., D + 2]`` uint8 rows: codes, then the float16 scale's bytes."""
    x = x.float()
    absmax = x.abs().amax(dim=-1, keepdim=True)
    # at least float16's smallest normal: a subnormal scale would round far from absmax / max_code
    scale = (absmax / fmt.max_code).clamp_(min=MIN_SCALE).to(torch.float16)
    scaled = (x / scale.float()).clamp_(-fmt.max_code, fmt.max_code)
    if fmt.code_dtype == torch.int8:
        codes = scaled.round_().to(torch.int8)
    else:
        codes = scaled.to(fmt.code_dtype)
    return torch.cat([codes.view(torch.uint8), scale.view(torch.uint8)], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[..., D + 2]`` cache rows in a code dtype -> ``[..., D]`` values in ``dtype``."""
    raw = rows.view(torch.uint8)
    head_dim = raw.shape[-1] - SCALE_BYTES
    codes = raw[..., :head_dim].view(rows.dtype).float()
    scale = raw[..., head_dim:].contiguous().view(torch.float16).float()
    return (codes * scale).to(dtype)


def write_quantized_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor, fmt: KVCacheFormat) -> None:
    """Quantize each token's K/V rows and store them at their cache slots."""
    num_kv_heads, row = k_cache.shape[2], k_cache.shape[3]
    for x, cache in ((key, k_cache), (value, v_cache)):
        cache.view(torch.uint8).view(-1, num_kv_heads, row).index_copy_(0, slot_mapping, quantize_rows(x, fmt))
