"""Where one model step's time goes on CPU with the engine's fast path (the bf16 linear kernel, the cpu
attention kernels, fused ops): torch.profiler's top-level ops of a step, grouped, against its wall time.

Groups: linear layers (by shape, with the GFLOP/s each reaches), the logits matmul, the paged-attention
kernel, the prefill attention kernel (fresh bf16 prefill chunks), SDPA (other prefill chunks), the
fused element-wise ops, other aten ops, and "host": the wall time no op accounts for (Python between
ops). A bf16 GEMM micro-benchmark gives the CPU's limit.

    .venv/bin/python scripts/cpu_step_profile.py --threads 2
    .venv/bin/python scripts/cpu_step_profile.py --cases decode64,decode128
    .venv/bin/python scripts/cpu_step_profile.py --out docs/results/cpu-step-profile.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_linear_bench import gemm_limit, step_inputs  # noqa: E402
from folovllm.kernel_libraries import CPU_BF16_LINEAR_LIBRARY, cpu_bf16_linear_available  # noqa: E402
from folovllm.model.loader import default_model_path, load_model  # noqa: E402
from folovllm.paging import blocks_for_tokens  # noqa: E402

BLOCK_SIZE = 16
# (name, query_lens, seq_lens): one engine step each; 16 x 512 prompts run 4 per 2048-token step
CASES = {
    "prefill": ("prefill 1 x 512", [512], [512]),
    "prefill4": ("prefill 4 x 512 (a 2048-token step of 16 x 512)", [512] * 4, [512] * 4),
    "decode128": ("decode batch 128, context 200", [1] * 128, [200] * 128),
    "decode64": ("decode batch 64, context 80", [1] * 64, [80] * 64),
    "decode1": ("decode batch 1, context 100", [1], [100]),
}


def group_of(name: str) -> str:
    if name == "folovllm_cpu::prefill_attention":
        return "prefill attention kernel"
    if name.startswith("folovllm_cpu::"):
        return "attention kernel"
    if name.startswith("folovllm_cpu_fused::"):
        return "fused ops"
    if "scaled_dot_product" in name:
        return "sdpa"
    if name in ("mkldnn::_linear_pointwise", "folovllm_cpu_linear::linear"):
        return "linear"
    return "other aten"


def profile_step(model: torch.nn.Module, query_lens: list[int], seq_lens: list[int], reps: int) -> dict:
    arch = model.arch
    num_blocks = sum(blocks_for_tokens(s, BLOCK_SIZE) for s in seq_lens)
    shape = (num_blocks, BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim)
    caches = [(torch.randn(shape).bfloat16(), torch.randn(shape).bfloat16()) for _ in range(arch.num_hidden_layers)]
    ids, positions, meta = step_inputs(query_lens, seq_lens)
    last_rows = torch.tensor(query_lens).cumsum(0) - 1

    def step() -> None:
        hidden = model(ids, positions, caches, meta)
        with record_function("logits"):
            logits = model.compute_logits(hidden[last_rows])
        with record_function("argmax"):
            logits.argmax(-1)

    with torch.inference_mode():
        step()
        walls = []
        for _ in range(reps):
            start = time.perf_counter()
            step()
            walls.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            start = time.perf_counter()
            step()
            profiled_wall = time.perf_counter() - start
    groups: dict[str, float] = collections.Counter()
    linear_shapes: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.name in ("logits", "argmax"):
            groups[e.name] += e.cpu_time_total / 1e3
            continue
        if e.cpu_parent is not None and e.cpu_parent.name not in ("logits", "argmax"):
            continue
        if e.cpu_parent is not None:  # inside logits / argmax: counted there
            continue
        if "::" not in e.name:
            continue
        group = group_of(e.name)
        groups[group] += e.cpu_time_total / 1e3
        if group == "linear" and e.input_shapes:
            m, k = e.input_shapes[0][0], e.input_shapes[0][-1]
            weight = e.input_shapes[1] if len(e.input_shapes) > 1 else []
            # the bf16 kernel's packed weight is [N/64, K/2, 64, 2]
            n = (weight[0] * weight[2] if len(weight) == 4 else weight[0]) if weight else "?"
            key = f"M={m} K={k} N={n}"
            linear_shapes[key][0] += e.cpu_time_total / 1e3
            linear_shapes[key][1] += 1
    accounted = sum(groups.values())
    groups["host (unaccounted)"] = profiled_wall * 1e3 - accounted
    linears = {}
    for key, (ms, count) in sorted(linear_shapes.items(), key=lambda kv: -kv[1][0]):
        parts = dict(p.split("=") for p in key.split())
        flops = 2 * int(parts["M"]) * int(parts["K"]) * int(parts["N"]) * count if parts["N"] != "?" else 0
        linears[key] = {"ms": ms, "calls": count, "gflops": flops / ms / 1e6 if ms else 0.0}
    return {"wall_ms_median": statistics.median(walls) * 1e3, "profiled_wall_ms": profiled_wall * 1e3,
            "groups_ms": dict(groups), "linears": linears}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", help="write the results here (JSON)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--no-bf16-linear", action="store_true",
                        help="linears and LM head on oneDNN instead of FoloVLLM's bf16 kernel")
    args = parser.parse_args()
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {', '.join(CASES)}")
    torch.set_num_threads(args.threads)
    bf16_linear = not args.no_bf16_linear and cpu_bf16_linear_available(CPU_BF16_LINEAR_LIBRARY)
    model = load_model(default_model_path(), dtype=torch.bfloat16, device="cpu", attn_backend="cpu",
                       cpu_prepack=True, cpu_fused_ops=True, cpu_bf16_linear=bf16_linear)
    results = {"threads": args.threads, "bf16_linear": bf16_linear, "load_before": os.getloadavg(), "cases": {}}
    for name, query_lens, seq_lens in (CASES[key] for key in args.cases.split(",")):
        case = profile_step(model, query_lens, seq_lens, args.reps)
        results["cases"][name] = case
        print(f"\n{name}: wall median {case['wall_ms_median']:.1f} ms (profiled {case['profiled_wall_ms']:.1f})")
        for group, ms in sorted(case["groups_ms"].items(), key=lambda kv: -kv[1]):
            print(f"  {group:<22} {ms:8.2f} ms  {ms / case['profiled_wall_ms']:5.1%}")
        for key, info in case["linears"].items():
            print(f"    linear {key:<24} {info['ms']:7.2f} ms x{info['calls']:<3} {info['gflops']:6.0f} GFLOP/s")
    print("\nGEMM limit:")
    results["gemm_gflops"] = {"M=2048": gemm_limit(2048, 576, 1536, 5), "M=128": gemm_limit(128, 576, 1536, 5)}
    results["load_after"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
