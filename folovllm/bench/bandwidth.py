"""The host's memory bandwidth, measured in the command that reports a kernel or a step against it.

A decode step of one stream reads every weight once, so its speed limit is how fast memory delivers bytes.
Two figures, each the best of a few tries (a limit is a maximum: a busy moment on a shared host must not
lower it), over arrays far larger than any cache:

- triad: STREAM's a = b + s c in fp32, counted as STREAM counts it (two arrays read, one written: 12 bytes
  an element; the write's own read for ownership not counted);
- read: the sum of one array (4 bytes an element read), the pattern of streaming weights.
"""
from __future__ import annotations

import time

import torch

ARRAY_MIB = 256  # per array: far past the last-level cache of any host here


def _best_seconds(fn, tries: int) -> float:
    fn()  # the pages touched once before timing
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(threads: int, mib: int = ARRAY_MIB, tries: int = 5) -> dict[str, float]:
    """{"triad_gb_s", "read_gb_s", "threads", "array_mib"} on ``threads`` of torch's intra-op threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = mib * 2**20 // 4
        a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
        triad = _best_seconds(lambda: torch.add(b, c, alpha=3.0, out=a), tries)
        read = _best_seconds(lambda: b.sum(), tries)
    finally:
        torch.set_num_threads(previous)
    return {"triad_gb_s": 12 * n / triad / 1e9, "read_gb_s": 4 * n / read / 1e9, "threads": threads,
            "array_mib": mib}


def describe(bandwidth: dict[str, float]) -> str:
    return (f"memory: triad {bandwidth['triad_gb_s']:.1f} GB/s, read {bandwidth['read_gb_s']:.1f} GB/s "
            f"({bandwidth['threads']} threads, {bandwidth['array_mib']} MiB arrays, best of 5)")
