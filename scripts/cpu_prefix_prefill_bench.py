"""Prefill over a cached prefix on CPU: the paged kernel vs gathered blocks + SDPA, per attention layer.

    .venv/bin/python scripts/cpu_prefix_prefill_bench.py

For (cached context, new tokens) pairs, bf16, SmolLM2's 9 query / 3 KV heads of 64, block size 16,
2 threads: times the kernel computing the chunk (``skip_prefills_from=0``) against what the CPU backend
does from 8 new tokens on (gather the sequence's blocks, SDPA with an offset causal mask), alternating
rounds, median ms per layer, and the largest difference between the two outputs.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm.attention.cpu_backend import causal_mask, gather_sequence  # noqa: E402
from folovllm.kernel_libraries import CPU_ATTENTION_LIBRARY, load_cpu_attention_library  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
CASES = [(384, 56), (512, 24), (1024, 64), (400, 16), (400, 8), (400, 4), (2000, 8), (2000, 128)]


def main() -> None:
    reason = load_cpu_attention_library(CPU_ATTENTION_LIBRARY)
    if reason:
        raise SystemExit(reason)
    torch.set_num_threads(2)
    op = torch.ops.folovllm_cpu.paged_attention
    print("context  new  kernel ms  sdpa ms  max |diff|")
    for context, new in CASES:
        seq = context + new
        blocks = -(-seq // BLOCK)
        k_cache = torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(blocks)[None]
        query = torch.randn(new, HEADS, HEAD_DIM, dtype=torch.bfloat16)
        lens, starts, out = torch.tensor([seq]), torch.tensor([0, new]), torch.empty_like(query)

        def kernel() -> torch.Tensor:
            op(out, query, k_cache, v_cache, table, lens, starts, 0.125, False, 0)
            return out

        def sdpa() -> torch.Tensor:
            k, v = (gather_sequence(c, table[0], seq) for c in (k_cache, v_cache))
            return F.scaled_dot_product_attention(
                query.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                attn_mask=causal_mask(new, context, None, query.device), scale=0.125,
                enable_gqa=True)[0].transpose(0, 1)

        diff = (kernel().float() - sdpa().float()).abs().max().item()
        times: dict[str, list[float]] = {"kernel": [], "sdpa": []}
        for _ in range(7):
            for name, fn in (("kernel", kernel), ("sdpa", sdpa)):
                start = time.perf_counter()
                for _ in range(30):
                    fn()
                times[name].append((time.perf_counter() - start) / 30 * 1e3)
        print(f"{context:7d} {new:4d} {statistics.median(times['kernel']):10.3f} "
              f"{statistics.median(times['sdpa']):8.3f} {diff:10.2g}")


if __name__ == "__main__":
    main()
