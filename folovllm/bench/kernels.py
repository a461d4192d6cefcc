"""``folovllm bench kernel``: our kernels against what they replace, at a model's shapes, alternating rounds.

    folovllm bench kernel linear --rows 1,8,64,512 --dtype bfloat16
    folovllm bench kernel int4 --rows 1,64
    folovllm bench kernel gguf --types Q4_K,Q6_K,Q5_K,Q8_0 --rows 1,16 --shapes 2048x2048,8192x2048,2048x8192,49152x2048
    folovllm bench kernel attention --rows 1,64 --context 256
    folovllm bench kernel attention --rows 128 --context 2048 --kv-cache-dtype auto,int8,fp8_e4m3
    folovllm bench kernel attention --rows 4,16 --prompt-len 512     # a prefill step of fresh prompts
    folovllm bench kernel sampling --rows 1,64,256 --vocab 512,151936  # seeded top-k/top-p rows of logits
    FOLOVLLM_CPU_ISA=avx2 folovllm bench kernel linear       # the avx2 forms on a higher host

Each candidate is one way to run the op (``folovllm``: ours; ``onednn``, ``torch``: what ours replaces;
``gguf``: each GGUF type in our kernel, beside our bf16 linear, and Q4_K and Q6_K again with int8 activations
as ``Q4_K_a8`` and ``Q6_K_a8``; for ``sampling``, the sampler with the platform's candidate kernel and with its torch form), each
where it runs at this tier. A linear's
weights are the model's shapes (or ``--shapes``) with random values, enough copies called in turn
(``--copies``; default: at least 256 MiB of them, at most one per decoder layer) that a decode-sized call
streams its weight from memory as a decode step does. Each round times every candidate, in an order that
rotates per round; the medians, GB/s of weights read and GFLOP/s are reported, with the GB/s as a share of
the host's memory bandwidth (a STREAM-style triad, measured first in the same command: bench/bandwidth.py)
and, for calls of 64 rows or more, the share of this tier's GEMM limit (a large torch matmul's GFLOP/s in
the same dtype).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from folovllm.bench.bandwidth import ARRAY_MIB, describe, memory_bandwidth
from folovllm.model.loader import default_model_path, load_arch_config
from folovllm.platforms import platform_for

KERNELS = ("linear", "int4", "int8", "gguf", "attention", "sampling")
GGUF_TYPES = "Q4_K,Q6_K,Q5_K,Q8_0"
GGUF_A8_TYPES = ("Q4_K", "Q6_K")  # types gguf_gemm_a8 multiplies with int8 activations: timed again as <type>_a8
COPIES_MIB = 256  # weight copies of at least this many MiB per candidate: each call reads from memory
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def add_kernel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kernel", choices=KERNELS)
    parser.add_argument("--model", default=None, help="whose shapes (a .gguf or HF folder; default: the default model)")
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument("--rows", default="1,8,64", help="comma-separated rows per call (batch or prompt tokens)")
    parser.add_argument("--shapes", default=None,
                        help="linears: comma-separated OUTxIN shapes instead of the model's (e.g. 2048x2048,49152x2048)")
    parser.add_argument("--types", default=GGUF_TYPES, help="gguf: comma-separated GGUF types to time")
    parser.add_argument("--copies", type=int, default=0,
                        help="linears: weight copies per candidate (0: at least 256 MiB, at most one per layer)")
    parser.add_argument("--context", type=int, default=256, help="attention: cached tokens per sequence")
    parser.add_argument("--prompt-len", type=int, default=0,
                        help="attention: time a prefill step instead, --rows fresh prompts of this many tokens each")
    parser.add_argument("--backends", default="cpu,torch", help="attention: the backends to time (cpu: ours, torch: the reference)")
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="attention: comma-separated cache formats to time, e.g. auto,int8,fp8_e4m3 (auto: --dtype)")
    parser.add_argument("--scattered", action="store_true",
                        help="attention: each sequence's cache blocks at random places, as a long-running server's "
                             "are (default: in order, one after another)")
    parser.add_argument("--vocab", default=None,
                        help="sampling: comma-separated vocabulary sizes (default: the model's)")
    parser.add_argument("--bandwidth-mib", type=int, default=ARRAY_MIB,
                        help="linears: MiB per array of the memory bandwidth measurement (far past the caches)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the results here (JSON)")


def timed(fn: Callable[[], Any], min_s: float = 0.05) -> float:
    """Seconds per call of ``fn``: as many calls as take ``min_s``, after one warm-up."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / calls


def gemm_candidates(dtype: torch.dtype, size: int) -> dict[str, Callable[[], Any]]:
    """A large square GEMM in each way torch runs one here: MKL's ``mm`` and oneDNN's prepacked linear (what
    vLLM-CPU calls), in fp32 and, where the tier has native bf16 dot products, in ``dtype`` (elsewhere torch
    emulates bf16 far below its fp32, and timing that would take minutes)."""
    from folovllm.platforms import isa

    native = dtype == torch.float32 or isa.native_bf16(isa.cpu_tier())
    found: dict[str, Callable[[], Any]] = {}
    for kind in dict.fromkeys((dtype, torch.float32) if native else (torch.float32,)):
        a, b = torch.randn(size, size, dtype=kind), torch.randn(size, size, dtype=kind)
        found[f"mm {kind}"] = lambda a=a, b=b: torch.mm(a, b)
        if torch.backends.mkldnn.is_available() and (kind == torch.float32
                                                     or torch.ops.mkldnn._is_mkldnn_bf16_supported()):
            packed = torch.ops.mkldnn._reorder_linear_weight(b, None)
            found[f"onednn {kind}"] = lambda a=a, p=packed: torch.ops.mkldnn._linear_pointwise(a, p, None, "none", [], "")
    return found


def gemm_limit(dtype: torch.dtype, size: int = 1536, tries: int = 5) -> tuple[float, str]:
    """The tier's practical GEMM limit: GFLOP/s of the fastest of ``gemm_candidates``, the best of ``tries``
    timings each (a limit is a maximum: a busy moment on a shared host must not lower it), and which one."""
    best, which = 0.0, ""
    for name, fn in gemm_candidates(dtype, size).items():
        rate = max(2 * size**3 / timed(fn, 0.2) / 1e9 for _ in range(tries))
        if rate > best:
            best, which = rate, name
    return best, which


def linear_shapes(arch: Any, shapes: str | None = None) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear of a decoder layer, and the LM head; or each OUTxIN of ``shapes``."""
    if shapes:
        found = {}
        for shape in shapes.split(","):
            out_f, _, in_f = shape.partition("x")
            if not (out_f.isdigit() and in_f.isdigit()):
                raise ValueError(f"--shapes takes OUTxIN, e.g. 2048x8192; got {shape!r}")
            found[shape] = (int(out_f), int(in_f))
        return found
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    return {"qkv": (q + 2 * kv, arch.hidden_size), "o_proj": (arch.hidden_size, q),
            "gate_up": (2 * arch.intermediate_size, arch.hidden_size), "down": (arch.hidden_size, arch.intermediate_size),
            "lm_head": (arch.vocab_size, arch.hidden_size)}


def copies_for(bytes_per_copy: int, most: int, asked: int = 0) -> int:
    """Weight copies of a candidate: ``asked``, or enough for COPIES_MIB (2 to ``most``)."""
    return asked or max(2, min(most, -(-COPIES_MIB * 2**20 // max(bytes_per_copy, 1))))


Candidate = tuple[list[Callable], int]  # one callable per weight copy (x -> y), bytes of weights each call reads


def linear_candidates(out_f: int, in_f: int, dtype: torch.dtype, kind: str, most: int, asked: int = 0,
                      types: str = GGUF_TYPES) -> dict[str, Candidate]:
    """Each way this platform runs such a linear: name -> (callables, weight bytes per call)."""
    from folovllm.model.quantization.packed import pack_linear_weight, packed_linear
    from folovllm.platforms import LinearKernels

    kernels = platform_for("cpu").linear_kernels(dtype)
    size = torch.empty((), dtype=dtype).element_size()
    copies = copies_for(out_f * in_f * size, most, asked)
    found: dict[str, Candidate] = {}
    if kind in ("linear", "gguf") and kernels.dense == "folovllm":
        weights = [torch.randn(out_f, in_f, dtype=dtype) * 0.02 for _ in range(copies)]
        packed = [pack_linear_weight(w, ours=True) for w in weights]
        found["folovllm" if kind == "linear" else "bf16"] = (
            [lambda x, p=p: packed_linear(x, p, None) for p in packed], out_f * in_f * size)
    if kind == "gguf":
        from folovllm.bench.gguf_blocks import random_gguf_blocks, type_id
        from folovllm.model.quantization.gguf_native import GGUFWeight, packed_bytes

        for name in types.split(","):
            nbytes = packed_bytes(type_id(name), out_f, in_f)
            tables = []
            for i in range(copies_for(nbytes, most, asked)):
                table = GGUFWeight([(type_id(name), out_f)], in_f)
                table.piece0.weight_loader(table.piece0, torch.from_numpy(random_gguf_blocks(name, out_f, in_f, i)))
                tables.append(table)
            found[name] = ([t.matmul for t in tables], nbytes)
            if name in GGUF_A8_TYPES:  # the same weights through gguf_gemm_a8 (FOLOVLLM_CPU_GGUF_A8)
                found[f"{name}_a8"] = ([lambda x, t=t: t.matmul(x, a8_rows=1) for t in tables], nbytes)
        return found
    weights = [torch.randn(out_f, in_f, dtype=dtype) * 0.02 for _ in range(copies)]
    if kind == "linear":
        if kernels.dense_fallback == "onednn" or kernels.dense == "onednn":
            packed = [pack_linear_weight(w, ours=False, onednn=True) for w in weights]
            found["onednn"] = ([lambda x, p=p: packed_linear(x, p, None) for p in packed], out_f * in_f * size)
        found["torch"] = ([lambda x, w=w: torch.nn.functional.linear(x, w) for w in weights], out_f * in_f * size)
        if dtype != torch.float32:  # the same layer served in fp32, as --dtype float32 would run it
            packed = [pack_linear_weight(w.float(), ours=False, onednn=True) for w in weights]
            found["fp32"] = ([lambda x, p=p: packed_linear(x.float(), p, None) for p in packed], out_f * in_f * 4)
        return found
    from folovllm.model.quantization.int8 import quantize_int8_per_channel
    from folovllm.model.quantization.kernels import Int8ChannelKernel, int4_group_kernel

    for backend in ("folovllm", "torch"):
        if backend == "folovllm" and kernels.quant != "folovllm":
            continue
        if kind == "int8":
            mods = [Int8ChannelKernel(*quantize_int8_per_channel(w, dtype), None, backend) for w in weights]
        else:
            group = 32 if in_f % 128 else 128
            codes = [torch.randint(0, 16, (out_f, in_f), dtype=torch.uint8) for _ in weights]
            scales = torch.rand(out_f, in_f // group) * 0.01
            mods = [int4_group_kernel(c, scales, torch.zeros_like(scales), group, dtype,
                                      LinearKernels(quant=backend)) for c in codes]
        found[backend] = ([m.forward for m in mods], out_f * in_f * (1 if kind == "int8" else 0.5))
    return found


def bench_linears(args: argparse.Namespace, arch: Any, dtype: torch.dtype) -> tuple[list[dict[str, Any]], dict]:
    bandwidth = memory_bandwidth(args.threads, args.bandwidth_mib)
    print(describe(bandwidth))
    limit, which = gemm_limit(dtype)
    print(f"GEMM limit (the fastest 1536^2 GEMM of torch's here, best of 5): {limit:.1f} GFLOP/s ({which})")
    rows_list = [int(r) for r in args.rows.split(",")]
    rows_out = []
    for name, (out_f, in_f) in linear_shapes(arch, args.shapes).items():
        most = 1 if name == "lm_head" else arch.num_hidden_layers
        candidates = linear_candidates(out_f, in_f, dtype, args.kernel, most, args.copies, args.types)
        for rows in rows_list:
            x = torch.randn(rows, in_f, dtype=dtype)
            samples: dict[str, list[float]] = {c: [] for c in candidates}
            order = list(candidates)
            for r in range(args.rounds):
                for cand in order[r % len(order):] + order[:r % len(order)]:
                    fns = candidates[cand][0]
                    samples[cand].append(timed(lambda: [f(x) for f in fns]) / len(fns))
            for cand, times in samples.items():
                seconds = statistics.median(times)
                gflops = 2 * rows * out_f * in_f / seconds / 1e9
                gb_s = candidates[cand][1] / seconds / 1e9
                row = {"shape": name, "out": out_f, "in": in_f, "rows": rows, "candidate": cand, "us": seconds * 1e6,
                       "weight_bytes": candidates[cand][1], "copies": len(candidates[cand][0]), "gb_s": gb_s,
                       "triad_share": gb_s / bandwidth["triad_gb_s"], "gflop_s": gflops,
                       "gemm_limit_gflop_s": limit, "gemm_limit_by": which,
                       "gemm_limit_share": gflops / limit if rows >= 64 else None}
                rows_out.append(row)
                share = f"  {row['gemm_limit_share']:.0%} of the GEMM limit" if row["gemm_limit_share"] else ""
                print(f"{name:8s} [{out_f}x{in_f}] rows {rows:4d} {cand:9s} {row['us']:9.1f} us "
                      f"{gb_s:6.1f} GB/s ({row['triad_share']:4.0%} of triad) {gflops:7.1f} GFLOP/s{share}")
        del candidates
    return rows_out, bandwidth


def bench_attention(args: argparse.Namespace, arch: Any, dtype: torch.dtype) -> list[dict[str, Any]]:
    """One step's attention over all layers' caches (a decode step, or with --prompt-len a step of fresh
    prompts): our kernel against the torch backend, with GFLOP/s of the (query, key) pairs computed."""
    from folovllm.attention.backend import get_attention_backend
    from folovllm.attention.kv_quant import KVCacheFormat, kv_cache_format, quantize_rows

    block = 16
    backends = {name: get_attention_backend(name) for name in args.backends.split(",")
                if name == "torch" or platform_for("cpu").auto_attention_backend() == "cpu"}
    formats = {name: kv_cache_format(name) for name in args.kv_cache_dtype.split(",")}
    candidates = {(b if f == "auto" else f"{b}/{f}"): (backend, fmt)
                  for b, backend in backends.items() for f, fmt in formats.items()}
    heads, kv_heads, dim = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim

    def cache(rows: int, fmt: KVCacheFormat | None) -> torch.Tensor:
        values = torch.randn(rows, block, kv_heads, dim, dtype=dtype)
        return values if fmt is None else quantize_rows(values, fmt).view(fmt.code_dtype)

    rows_out = []
    for batch in (int(r) for r in args.rows.split(",")):
        meta, q, k, v = step_inputs(batch, args.context, args.prompt_len, block, (heads, kv_heads, dim), dtype,
                                    scattered=args.scattered)
        blocks = meta.block_tables.shape[1]
        caches = {f: [(cache(batch * blocks, fmt), cache(batch * blocks, fmt)) for _ in range(arch.num_hidden_layers)]
                  for f, fmt in formats.items()}
        samples: dict[str, list[float]] = {c: [] for c in candidates}
        order = list(candidates)
        for r in range(args.rounds):
            for cand in order[r % len(order):] + order[:r % len(order)]:
                backend, fmt = candidates[cand]
                layers = caches[cand.partition("/")[2] or "auto"]
                step = lambda: [backend.forward(q, k, v, kc, vc, meta, dim**-0.5) for kc, vc in layers]  # noqa: E731
                samples[cand].append(timed(step))
        # the (query, key) pairs each head computes: causal over a fresh prompt, the whole cache at decode
        pairs = batch * (args.prompt_len * (args.prompt_len + 1) // 2 if args.prompt_len else args.context + 1)
        for cand, times in samples.items():
            seconds = statistics.median(times)
            row = {"batch": batch, "context": 0 if args.prompt_len else args.context, "prompt_len": args.prompt_len,
                   "candidate": cand, "us_per_step": seconds * 1e6,
                   "gflop_s": 4 * pairs * heads * dim * arch.num_hidden_layers / seconds / 1e9}
            rows_out.append(row)
            shape = f"prompts {batch:4d} x {args.prompt_len:5d}" if args.prompt_len else \
                f"batch {batch:4d} context {args.context:5d}"
            print(f"attention {shape} {cand:14s} {row['us_per_step']:10.1f} us per step "
                  f"({arch.num_hidden_layers} layers), {row['gflop_s']:6.1f} GFLOP/s")
    return rows_out


def bench_sampling(args: argparse.Namespace, arch: Any) -> list[dict[str, Any]]:
    """A step's sampling from float32 logits, every row seeded with temperature 0.8, top-k 50 and top-p 0.9 (the
    sampler's candidate path): the platform's kernel against the torch form."""
    from folovllm.sample.metadata import SamplingRow, build_sampling_batch
    from folovllm.sample.sampler import Sampler
    from folovllm.sampling_params import SamplingParams

    kernel = platform_for("cpu").candidate_sampler()
    candidates = {"torch": Sampler(top_k_candidates=True)}
    if kernel is not None:
        candidates["folovllm"] = Sampler(top_k_candidates=True, candidate_kernel=kernel)
    vocabs = [int(v) for v in args.vocab.split(",")] if args.vocab else [arch.vocab_size]
    rows_out = []
    for vocab in vocabs:
        for batch in (int(r) for r in args.rows.split(",")):
            params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=i) for i in range(batch)]
            sampling = build_sampling_batch([SamplingRow(p, p.seed, 1) for p in params], [None] * batch, vocab, "cpu")
            logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
            samples: dict[str, list[float]] = {c: [] for c in candidates}
            order = list(candidates)
            for r in range(args.rounds):
                for cand in order[r % len(order):] + order[:r % len(order)]:
                    samples[cand].append(timed(lambda: candidates[cand].sample(logits, sampling)))  # noqa: B023
            for cand, times in samples.items():
                row = {"batch": batch, "vocab": vocab, "candidate": cand, "us_per_step": statistics.median(times) * 1e6}
                rows_out.append(row)
                print(f"sampling batch {batch:4d} vocab {vocab:7d} {cand:10s} {row['us_per_step']:10.1f} us per step")
    return rows_out


def step_inputs(batch: int, context: int, prompt_len: int, block: int, shape: tuple[int, int, int],
                dtype: torch.dtype, scattered: bool = False) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's metadata and new q, k, v: ``batch`` decode rows over ``context`` cached tokens each, or
    (``prompt_len`` > 0) ``batch`` fresh prompts of ``prompt_len`` tokens; their cache blocks in order, or
    (``scattered``) a seeded random permutation of the same blocks."""
    from folovllm.attention.metadata import AttentionMetadata

    heads, kv_heads, dim = shape
    new = prompt_len or 1
    total = prompt_len or context + 1
    blocks = -(-total // block)
    order = torch.randperm(batch * blocks, generator=torch.Generator().manual_seed(0)) if scattered else \
        torch.arange(batch * blocks)
    tables = order.view(batch, blocks)
    positions = torch.arange(total - new, total)
    slots = (tables[:, positions // block] * block + positions % block).reshape(-1)
    meta = AttentionMetadata(slot_mapping=slots, query_start_loc=torch.arange(batch + 1) * new,
                             seq_lens=torch.tensor([total] * batch), block_tables=tables, query_lens=[new] * batch,
                             seq_lens_list=[total] * batch, block_size=block)
    rows = batch * new
    return (meta, torch.randn(rows, heads, dim, dtype=dtype), torch.randn(rows, kv_heads, dim, dtype=dtype),
            torch.randn(rows, kv_heads, dim, dtype=dtype))


def run_bench_kernel(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    platform = platform_for("cpu")
    if args.kernel == "gguf":  # a bad type named before anything is measured
        from folovllm.bench.gguf_blocks import type_id

        for name in args.types.split(","):
            type_id(name)
    arch = load_arch_config(args.model or default_model_path())
    print(f"platform: {platform.describe()}; model: {arch.name}; {args.threads} threads")
    bandwidth = None
    with torch.inference_mode():
        if args.kernel == "attention":
            rows = bench_attention(args, arch, dtype)
        elif args.kernel == "sampling":
            rows = bench_sampling(args, arch)
        else:
            rows, bandwidth = bench_linears(args, arch, dtype)
    results = {"kernel": args.kernel, "dtype": args.dtype, "threads": args.threads, "rounds": args.rounds,
               "model": arch.name, "platform": platform.describe(), "memory_bandwidth": bandwidth, "rows": rows,
               "args": {k: v for k, v in vars(args).items() if k != "func"}}
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return results
