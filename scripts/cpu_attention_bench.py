"""Model step time with the cpu attention kernel vs the torch backend, in one process, alternating.

One model (the default SmolLM2-135M, bfloat16); its attention layers are switched between the two
backends each round, over the same KV cache and metadata, so both see the same machine state.

    .venv/bin/python scripts/cpu_attention_bench.py                        # prints the table
    .venv/bin/python scripts/cpu_attention_bench.py --out docs/results/cpu-attention.json
    .venv/bin/python scripts/cpu_attention_bench.py --kernel-only --threads 1   # the op alone, decode

--kernel-only times the kernel op by itself on decode batches (9 q / 3 kv heads, head_dim 64, bf16),
its decode fast path on vs off (the general path) alternating each round; process CPU time per call,
so other jobs on a shared machine inflate it less than wall time.

--decode-prefetch times what the model sees at batch 128: one decode step's 30 layers, each over its own
cache (together far beyond L3, so K/V stream from memory) with blocks interleaved across sequences as
they grow together, prefetching the next tile on vs off, alternating each round (process CPU time and
wall time per step):

    .venv/bin/python scripts/cpu_attention_bench.py --decode-prefetch --threads 1

--claims does the same for how the kernel's threads take work items (runs vs one at a time; at 2 threads):

    .venv/bin/python scripts/cpu_attention_bench.py --claims --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm.attention.backend import get_attention_backend  # noqa: E402
from folovllm.attention.metadata import AttentionMetadata  # noqa: E402
from folovllm.model.loader import default_model_path, load_model  # noqa: E402
from folovllm.paging import blocks_for_tokens  # noqa: E402

BLOCK_SIZE = 16
# (name, sequences, tokens each computes this step, tokens each has cached before it)
CASES = [
    ("decode batch 1, context 1024", 1, 1, 1023),
    ("decode batch 64, context 512", 64, 1, 511),
    ("decode batch 64, context 1024", 64, 1, 1023),
    ("prefill 16 x 512", 16, 512, 0),
]


def step_inputs(num_seqs: int, q_len: int, cached: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                             AttentionMetadata]:
    """Token ids, positions and metadata for one step; sequence i owns a contiguous run of blocks."""
    seq_len = cached + q_len
    per_seq = blocks_for_tokens(seq_len, BLOCK_SIZE)
    tables = torch.arange(num_seqs * per_seq).view(num_seqs, per_seq)
    positions = torch.arange(cached, seq_len).repeat(num_seqs)
    slots = (tables[:, :, None] * BLOCK_SIZE + torch.arange(BLOCK_SIZE)).flatten(1)[:, cached:seq_len].flatten()
    meta = AttentionMetadata(
        slot_mapping=slots, query_start_loc=torch.arange(num_seqs + 1) * q_len,
        seq_lens=torch.full((num_seqs,), seq_len), block_tables=tables,
        query_lens=[q_len] * num_seqs, seq_lens_list=[seq_len] * num_seqs, block_size=BLOCK_SIZE)
    input_ids = torch.randint(0, vocab, (num_seqs * q_len,))
    return input_ids, positions, meta


HEADS = (9, 3, 64)  # the default model's query heads, KV heads and head_dim


def load_kernel() -> torch.Generator:
    """Loads the CPU attention library (or exits saying why not); a seeded generator for the inputs."""
    from folovllm.kernel_libraries import CPU_ATTENTION_LIBRARY, load_cpu_attention_library
    reason = load_cpu_attention_library(CPU_ATTENTION_LIBRARY)
    if reason is not None:
        raise SystemExit(reason)
    return torch.Generator().manual_seed(0)


KERNEL_CASES = [(1, 128), (1, 256), (1, 1024), (64, 128), (64, 256), (64, 1024)]  # (sequences, context)


def kernel_only(rounds: int) -> list[dict]:
    """Median µs per call of the kernel op, decode fast path on vs off, alternating each round."""
    gen = load_kernel()
    heads, kv_heads, head_dim = HEADS
    results = []
    for num_seqs, context in KERNEL_CASES:
        per_seq = blocks_for_tokens(context, BLOCK_SIZE)
        k_cache = torch.randn(num_seqs * per_seq, BLOCK_SIZE, kv_heads, head_dim, generator=gen).bfloat16()
        v_cache = torch.randn(k_cache.shape, generator=gen).bfloat16()
        tables = torch.randperm(num_seqs * per_seq, generator=gen).view(num_seqs, per_seq)
        query = torch.randn(num_seqs, heads, head_dim, generator=gen).bfloat16()
        out, lens, starts = torch.empty_like(query), torch.full((num_seqs,), context), torch.arange(num_seqs + 1)
        calls = max(1, 30_000 // (num_seqs * context // 64))
        times: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(rounds + 1):  # round 0 warms up
            for fast in (False, True):
                start = time.process_time()
                for _ in range(calls):
                    torch.ops.folovllm_cpu.paged_attention(out, query, k_cache, v_cache, tables, lens, starts,
                                                           head_dim ** -0.5, True, 0, fast)
                if round_:
                    times[fast].append((time.process_time() - start) / calls * 1e6)
        med = {("fast" if f else "general"): statistics.median(t) for f, t in times.items()}
        results.append({"num_seqs": num_seqs, "context": context, "median_us": med,
                        "speedup": med["general"] / med["fast"]})
        print(f"decode batch {num_seqs:3d} x {context:5d}: general {med['general']:9.1f} us  "
              f"fast {med['fast']:9.1f} us  {med['general'] / med['fast']:.2f}x", flush=True)
    return results


# (label, batch, shortest context, longest context): contexts spread evenly between the two
PREFETCH_CASES = [("context 40", 128, 40, 40), ("context 200", 128, 200, 200), ("context 128-256", 128, 128, 256)]
PREFETCH_LAYERS = 30


CLAIM_CASES = [("context 2", 128, 2, 2), ("context 16", 128, 16, 16), ("context 200", 128, 200, 200)]


def decode_switch(rounds: int, switch: str) -> list[dict]:
    """Median ms per 30-layer decode step with one of the kernel's switches off vs on, alternating:
    ``prefetch`` (decode_prefetch) or ``claims`` (chunked_claims)."""
    gen = load_kernel()
    heads, kv_heads, head_dim = HEADS
    results = []
    for label, num_seqs, shortest, longest in (PREFETCH_CASES if switch == "prefetch" else CLAIM_CASES):
        per_seq = blocks_for_tokens(longest, BLOCK_SIZE)
        shape = (num_seqs * per_seq, BLOCK_SIZE, kv_heads, head_dim)
        caches = [(torch.randn(shape, generator=gen).bfloat16(), torch.randn(shape, generator=gen).bfloat16())
                  for _ in range(PREFETCH_LAYERS)]
        # block j of sequence s: the j-th block handed out while all sequences grow one token a step
        tables = torch.arange(per_seq)[None, :] * num_seqs + torch.arange(num_seqs)[:, None]
        lens = torch.linspace(shortest, longest, num_seqs).round().long()
        queries = [torch.randn(num_seqs, heads, head_dim, generator=gen).bfloat16() for _ in range(PREFETCH_LAYERS)]
        starts = torch.arange(num_seqs + 1)
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        outputs = {}
        for round_ in range(rounds + 1):  # round 0 warms up
            for on in ((False, True) if round_ % 2 else (True, False)):
                out = torch.empty_like(queries[0])
                flags = (on, True) if switch == "prefetch" else (True, on)  # (decode_prefetch, chunked_claims)
                wall, cpu = time.perf_counter(), time.process_time()
                for query, (k_cache, v_cache) in zip(queries, caches):
                    torch.ops.folovllm_cpu.paged_attention(out, query, k_cache, v_cache, tables, lens, starts,
                                                           head_dim ** -0.5, True, 0, True, 0, True, *flags)
                if round_:
                    times[on].append(((time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3))
                outputs[on] = out
        if not torch.equal(outputs[True], outputs[False]):
            raise SystemExit(f"{label}: {switch} changed the output")
        med = {("on" if f else "off"): {"wall": statistics.median(w for w, _ in t),
                                         "cpu": statistics.median(c for _, c in t)} for f, t in times.items()}
        kv_mb = PREFETCH_LAYERS * 2 * int(lens.sum()) * kv_heads * head_dim * 2 / 1e6
        results.append({"case": label, "num_seqs": num_seqs, "layers": PREFETCH_LAYERS, "kv_mb_per_step": kv_mb,
                        "median_ms": med, "cpu_speedup": med["off"]["cpu"] / med["on"]["cpu"],
                        "wall_speedup": med["off"]["wall"] / med["on"]["wall"]})
        off, on = med["off"], med["on"]
        print(f"batch {num_seqs} {label:<16} ({kv_mb:4.0f} MB K/V): {switch} off {off['cpu']:6.2f} ms  "
              f"on {on['cpu']:6.2f} ms CPU ({off['cpu'] / on['cpu']:.2f}x);  wall "
              f"{off['wall']:6.2f} / {on['wall']:6.2f} ms ({off['wall'] / on['wall']:.2f}x)", flush=True)
        del caches
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per case")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the results here (JSON)")
    parser.add_argument("--kernel-only", action="store_true", help="time the kernel op alone (decode)")
    parser.add_argument("--decode-prefetch", action="store_true",
                        help="30 layers' decode at batch 128, the kernel's next-tile prefetching off vs on")
    parser.add_argument("--claims", action="store_true",
                        help="30 layers' decode at batch 128, threads claiming runs of items vs one at a time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.decode_prefetch or args.claims:
        results = decode_switch(args.rounds, "prefetch" if args.decode_prefetch else "claims")
        if args.out:
            info = {"threads": args.threads, "load_average": os.getloadavg(), "dtype": "bfloat16",
                    "block_size": BLOCK_SIZE}
            Path(args.out).write_text(json.dumps([{**r, **info} for r in results], indent=1) + "\n")
        return
    if args.kernel_only:
        results = kernel_only(args.rounds)
        if args.out:
            info = {"threads": args.threads, "load_average": os.getloadavg(), "dtype": "bfloat16",
                    "block_size": BLOCK_SIZE}
            Path(args.out).write_text(json.dumps([{**r, **info} for r in results], indent=1) + "\n")
        return
    backends = {name: get_attention_backend(name) for name in ("torch", "cpu")}
    model = load_model(default_model_path(), dtype=torch.bfloat16, device="cpu", attn_backend=backends["torch"])
    arch = model.arch
    attention_layers = [m for m in model.modules() if hasattr(m, "backend")]
    results = []
    for name, num_seqs, q_len, cached in CASES:
        input_ids, positions, meta = step_inputs(num_seqs, q_len, cached, arch.vocab_size)
        num_blocks = meta.block_tables.numel()
        kv_caches = []
        for _ in range(arch.num_hidden_layers):
            k = torch.randn(num_blocks, BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim, dtype=torch.bfloat16)
            kv_caches.append((k, torch.randn_like(k)))
        times: dict[str, list[float]] = {b: [] for b in backends}
        with torch.inference_mode():
            for round_ in range(args.rounds + 1):  # round 0 warms up
                for backend_name, backend in backends.items():
                    for layer in attention_layers:
                        layer.backend = backend
                    start = time.perf_counter()
                    model(input_ids, positions, kv_caches, meta)
                    if round_:
                        times[backend_name].append(time.perf_counter() - start)
        med = {b: statistics.median(t) * 1e3 for b, t in times.items()}
        spread = {b: (min(t) * 1e3, max(t) * 1e3) for b, t in times.items()}
        results.append({"case": name, "num_seqs": num_seqs, "query_len": q_len, "context": cached + q_len,
                        "rounds": args.rounds, "median_ms": med, "min_max_ms": spread,
                        "speedup": med["torch"] / med["cpu"]})
        print(f"{name:32s} torch {med['torch']:9.1f} ms  cpu {med['cpu']:9.1f} ms  "
              f"torch/cpu {med['torch'] / med['cpu']:.2f}x  (torch {spread['torch'][0]:.0f}-{spread['torch'][1]:.0f}, "
              f"cpu {spread['cpu'][0]:.0f}-{spread['cpu'][1]:.0f})", flush=True)
        del kv_caches
    if args.out:
        meta_info = {"model": "SmolLM2-135M-Instruct", "dtype": "bfloat16", "threads": args.threads,
                     "block_size": BLOCK_SIZE, "machine": platform.processor() or platform.machine()}
        Path(args.out).write_text(json.dumps([{**r, **meta_info} for r in results], indent=1) + "\n")


if __name__ == "__main__":
    main()
