"""How fast our int4 matmuls and the int8 LM head stream their weights at one row (a one-stream decode step).

    .venv/bin/python scripts/quant_gemv_bench.py                      # 1 and 2 threads, streamed and hot
    .venv/bin/python scripts/quant_gemv_bench.py --threads 1 --rounds 7 --rows 1 64

For each SmolLM2-135M linear shape it makes 30 layers' worth of random packed int4 weights (GPTQ g128
layout, bf16 scales and zeros) and calls ``int4_gemm`` on them in turn, as a decode step does, so the
weights come from memory and not from a cache ("streamed"); "hot" calls one layer's weights over and
over (what the kernel does with no memory to wait for). The int8 head (49152 x 576, 28 MiB) runs
``int8_argmax`` over three copies in turn, with the argmax inside the matmul's loop and, "logits+argmax",
the matmul's logits then torch's argmax (``fused=False``, ``FOLOVLLM_INT8_FUSED_ARGMAX=off``). A plain
read of a 256 MiB tensor (``sum``) gives the memory's rate at the same thread count. Reports median microseconds per call (wall and this thread's CPU time)
and GB/s of weight bytes read (codes + scales + zeros; of CPU time at one thread, of wall time at more),
with rounds alternating between cases in one process. The weights sit on 2 MiB pages as the engine's
do (``FOLOVLLM_HUGE_PAGE_WEIGHTS=off``: separate tensors on 4 KiB pages).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm.model.huge_pages import huge_page_weights_enabled, move_weights_to_huge_pages  # noqa: E402
from folovllm.model.quant.cpu_quant import cpu_quant_unavailable  # noqa: E402

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
HEAD = (576, 49152)  # K, N of the LM head
LAYERS = 30
HEAD_COPIES = 3  # 84 MiB: more than the L3, as the head is after 30 layers' weights have gone through it
GROUP = 128
READ_BYTES = 256 << 20


def int4_layer(k: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random packed int4 weights: codes [N / 16, K / 8, 16] (any 32 bits are 8 valid codes), scales, zeros."""
    groups = -(-k // GROUP)
    codes = torch.randint(-2**31, 2**31, (n // 16, k // 8, 16), dtype=torch.int32, generator=gen)
    scales = (torch.rand(n // 16, groups, 16, generator=gen) * 0.02).to(torch.bfloat16)
    zeros = (torch.randn(n // 16, groups, 16, generator=gen) * 0.01).to(torch.bfloat16)
    return codes, scales, zeros


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def cases(rows: int, gen: torch.Generator) -> dict[str, tuple[Callable[[int], object], int, int]]:
    """name -> (call(i) running the i-th call of a pass, calls per pass, weight bytes read per call).

    "streamed" cases go through all layers' four matmuls in a step's order (55 MB, more than the L3), one
    shape's calls timed apart; "hot" ones call one layer's weights over and over."""
    ops = torch.ops.folovllm_cpu_quant
    layers = [{name: int4_layer(k, n, gen) for name, (k, n) in SHAPES.items()} for _ in range(LAYERS)]
    xs = {name: torch.randn(rows, k, generator=gen).to(torch.bfloat16) for name, (k, _) in SHAPES.items()}
    out = {}
    for name in SHAPES:
        size = nbytes(*layers[0][name])
        out[f"{name} streamed"] = (lambda i, n=name: ops.int4_gemm(xs[n], *layers[i][n], GROUP), LAYERS, size)
    for name in SHAPES:
        size = nbytes(*layers[0][name])
        out[f"{name} hot"] = (lambda i, n=name: ops.int4_gemm(xs[n], *layers[0][n], GROUP), LAYERS, size)
    k, n = HEAD
    heads = [(torch.randint(-128, 128, (n // 16, k // 2, 16, 2), dtype=torch.int8, generator=gen),
              torch.rand(n, generator=gen) * 0.01) for _ in range(HEAD_COPIES)]
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    out["head int8_argmax"] = (lambda i: ops.int8_argmax(x, *heads[i]), HEAD_COPIES, nbytes(*heads[0]))
    out["head logits+argmax"] = (lambda i: ops.int8_argmax(x, *heads[i], False), HEAD_COPIES, nbytes(*heads[0]))
    if huge_page_weights_enabled():  # as the engine holds them (FOLOVLLM_HUGE_PAGE_WEIGHTS=off: separate tensors)
        holder = torch.nn.Module()
        weights = [t for layer in layers for parts in layer.values() for t in parts] + [t for h in heads for t in h]
        for i, t in enumerate(weights):
            holder.register_buffer(f"w{i}", t)
        move_weights_to_huge_pages(holder)
    block = torch.ones(READ_BYTES // 4, dtype=torch.float32)
    out["memory read (sum)"] = (lambda i: block.sum(), 1, READ_BYTES)
    return out


def time_round(table: dict, passes: int, wall: dict, cpu: dict) -> None:
    """One round: each case's mean over ``passes`` passes; streamed cases interleaved layer by layer."""
    streamed = [name for name in table if name.endswith("streamed")]
    spent = {name: [0.0, 0.0] for name in streamed}
    for _ in range(passes):
        for i in range(LAYERS):
            for name in streamed:
                w0, c0 = time.perf_counter(), time.thread_time()
                table[name][0](i)
                spent[name][0] += time.perf_counter() - w0
                spent[name][1] += time.thread_time() - c0
    for name in streamed:
        wall[name].append(spent[name][0] / (passes * LAYERS))
        cpu[name].append(spent[name][1] / (passes * LAYERS))
    for name, (call, calls, _) in table.items():
        if name in streamed:
            continue
        reps = 1 if "memory" in name else passes
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(reps):
            for i in range(calls):
                call(i)
        wall[name].append((time.perf_counter() - w0) / (reps * calls))
        cpu[name].append((time.thread_time() - c0) / (reps * calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rows", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=10, help="passes over the layers per round and case")
    parser.add_argument("--only", nargs="*", default=None, help="case names to keep (substring match)")
    parser.add_argument("--out", type=Path, default=None, help="write the medians as JSON here")
    parser.add_argument("--library", type=Path, default=None, help="a build of the quant library to load instead")
    args = parser.parse_args()
    reason = cpu_quant_unavailable(args.library) if args.library else cpu_quant_unavailable()
    if reason is not None:
        raise SystemExit(reason)
    gen = torch.Generator().manual_seed(0)
    results = []
    for rows in args.rows:
        table = cases(rows, gen)
        if args.only:
            table = {k: v for k, v in table.items() if any(s in k for s in args.only) or "memory" in k}
        for threads in args.threads:
            torch.set_num_threads(threads)
            wall: dict[str, list[float]] = {name: [] for name in table}
            cpu: dict[str, list[float]] = {name: [] for name in table}
            for name, (call, calls, _) in table.items():  # warm up
                for i in range(calls):
                    call(i)
            for _ in range(args.rounds):
                time_round(table, args.passes, wall, cpu)
            # one thread: its CPU time leaves out the time other processes held the core (a loaded machine)
            basis = "this thread's CPU" if threads == 1 else "wall"
            print(f"rows {rows}, {threads} thread(s): median us/call (wall, this thread's CPU), "
                  f"GB/s of weights ({basis})")
            for name, (_, _, size) in table.items():
                w, c = statistics.median(wall[name]), statistics.median(cpu[name])
                rate = size / (c if threads == 1 else w) / 1e9
                print(f"  {name:24s} {1e6 * w:9.1f} {1e6 * c:9.1f}  {rate:6.1f} GB/s  ({size / 1024:.0f} KiB)")
                results.append({"rows": rows, "threads": threads, "case": name, "wall_us": 1e6 * w,
                                "cpu_us": 1e6 * c, "bytes": size, "gb_per_s": rate, "gb_per_s_of": basis})
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
