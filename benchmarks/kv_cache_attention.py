"""The CPU decode-attention op alone over a bfloat16, int8 and fp8_e4m3 KV cache: one decode row per
sequence, SmolLM2-135M's heads (9 query, 3 KV, head_dim 64), bf16 queries, blocks of 16 shuffled.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/kv_cache_attention.py [BATCH] [CONTEXT]   # default 128 2048
"""
from __future__ import annotations

import sys
import time

import torch

from folovllm.attention.kv_quant import KV_CACHE_FORMATS, quantize_rows
from folovllm.platforms import kernel_library


def main(batch: int, context: int, block_size: int = 16) -> None:
    reason = kernel_library.load()
    if reason is not None:
        raise SystemExit(f"the kernel library does not run here: {reason}")
    torch.manual_seed(0)
    num_blocks = batch * context // block_size
    table = torch.randperm(num_blocks).view(batch, context // block_size)
    query = torch.randn(batch, 9, 64).bfloat16()
    keys, values = torch.randn(num_blocks, block_size, 3, 64), torch.randn(num_blocks, block_size, 3, 64)
    seq_lens, starts = torch.full((batch,), context), torch.arange(batch + 1)
    for name in ("auto", "int8", "fp8_e4m3"):
        if name == "auto":
            k_cache, v_cache = keys.bfloat16(), values.bfloat16()
        else:
            fmt = KV_CACHE_FORMATS[name]
            k_cache, v_cache = (quantize_rows(x, fmt).view(fmt.code_dtype) for x in (keys, values))
        out = torch.empty_like(query)
        times = []
        for _ in range(8):  # the first warms up
            start = time.perf_counter()
            torch.ops.folovllm.paged_attention(out, query, k_cache, v_cache, table, seq_lens, starts, 0.125, True, 0,
                                               True, 8, True, True, True)
            times.append(time.perf_counter() - start)
        print(f"{name:9s} batch {batch}, context {context}: median {sorted(times[1:])[3] * 1e3:.1f} ms a call "
              f"(K+V {2 * k_cache.nbytes / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
