"""Fresh-prompt prefill on CPU, in one process: the attention of fresh chunks on the library's causal
prefill kernel vs SDPA, alone per layer and as whole model steps, in alternating rounds.

The step is the prefill-heavy workload's: 4 prompts of 512 tokens in one 2048-token step (16 x 512
prompts run 4 per step at max_num_batched_tokens 2048), with the logits of each prompt's last row. Its
FLOPs (linears + causal attention + logits) over its time give the step's share of the bf16 GEMM
limit (the bf16 kernel's best GFLOP/s on one M=2048 K=576 N=1536 linear, measured here too).

``--cpu-time`` times with process CPU time instead of the wall clock: with ``--threads 1`` that is
robust to other processes on a busy machine (with more threads it also counts OpenMP's spinning).

    .venv/bin/python scripts/cpu_prefill_bench.py                      # 2 threads, wall clock
    .venv/bin/python scripts/cpu_prefill_bench.py --threads 1 --cpu-time
    .venv/bin/python scripts/cpu_prefill_bench.py --out docs/results/cpu-prefill.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm.attention import cpu_backend  # noqa: E402
from folovllm.model.cpu_packed import pack_linear_weight, packed_linear  # noqa: E402
from folovllm.model.loader import default_model_path, load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_linear_bench import make_step  # noqa: E402

PROMPTS, PROMPT_LEN = 4, 512
MODES = ("kernel", "sdpa")


def alternate(cases: dict[str, Callable[[], None]], rounds: int,
              clock: Callable[[], float]) -> dict[str, list[float]]:
    """Seconds of each case per round, the order flipped every round."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start = clock()
            cases[name]()
            times[name].append(clock() - start)
    return times


def attention_cases(num_heads: int, num_kv_heads: int, head_dim: int) -> dict[str, Callable[[], None]]:
    """One layer's attention of the step's fresh chunks: the kernel, and SDPA as the backend calls it."""
    tokens = PROMPTS * PROMPT_LEN
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim).bfloat16()
    q = qkv[:, :num_heads * head_dim].reshape(tokens, num_heads, head_dim).contiguous()
    k = qkv[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim].reshape(tokens, num_kv_heads,
                                                                                    head_dim).contiguous()
    v = qkv[:, (num_heads + num_kv_heads) * head_dim:].view(tokens, num_kv_heads, head_dim)
    out = torch.empty_like(q)
    starts, lens = [i * PROMPT_LEN for i in range(PROMPTS)], [PROMPT_LEN] * PROMPTS
    scale = head_dim ** -0.5

    def sdpa() -> None:
        for s in starts:
            rows = slice(s, s + PROMPT_LEN)
            out[rows] = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1)[None], k[rows].transpose(0, 1)[None], v[rows].transpose(0, 1)[None],
                is_causal=True, scale=scale, enable_gqa=num_heads != num_kv_heads)[0].transpose(0, 1)

    return {"kernel": lambda: cpu_backend.prefill_kernel(out, q, k, v, starts, lens, scale), "sdpa": sdpa}


def step_flops(model: torch.nn.Module) -> float:
    """Multiply-adds x 2 of the step: every linear over all rows, causal attention, the last rows' logits."""
    arch = model.arch
    tokens, hidden, head_dim = PROMPTS * PROMPT_LEN, arch.hidden_size, arch.head_dim
    qkv = hidden * (arch.num_attention_heads + 2 * arch.num_key_value_heads) * head_dim
    per_token = qkv + arch.num_attention_heads * head_dim * hidden + 3 * hidden * arch.intermediate_size
    linears = 2 * tokens * per_token * arch.num_hidden_layers
    pairs = PROMPTS * PROMPT_LEN * (PROMPT_LEN + 1) / 2  # (query, key) pairs a causal prompt scores
    attention = 2 * 2 * pairs * arch.num_attention_heads * head_dim * arch.num_hidden_layers
    return linears + attention + 2 * PROMPTS * hidden * arch.vocab_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu-time", action="store_true", help="process CPU time instead of the wall clock")
    parser.add_argument("--out", help="write the results here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    model = load_model(default_model_path(), dtype=torch.bfloat16, device="cpu", attn_backend="cpu",
                       cpu_prepack=True, cpu_fused_ops=True, cpu_bf16_linear=True)
    backends = {id(m.backend): m.backend for m in model.modules()
                if isinstance(getattr(m, "backend", None), cpu_backend.CpuAttentionBackend)}
    if not cpu_backend.prefill_kernel_enabled():
        raise SystemExit("the prefill kernel is off here (no AVX-512 BF16, or FOLOVLLM_CPU_PREFILL_ATTENTION=sdpa)")
    arch = model.arch
    results: dict = {"threads": args.threads, "clock": "cpu" if args.cpu_time else "wall",
                     "load_before": os.getloadavg()}
    with torch.inference_mode():
        attn = alternate(attention_cases(arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim),
                         args.rounds * 2, clock)
        step = make_step(model, [PROMPT_LEN] * PROMPTS, [PROMPT_LEN] * PROMPTS)

        def step_with(mode: str) -> Callable[[], None]:
            def run() -> None:
                for backend in backends.values():
                    backend._prefill_kernel = mode == "kernel"
                step()
            return run

        steps = alternate({mode: step_with(mode) for mode in MODES}, args.rounds, clock)
        x = torch.randn(2048, 576, dtype=torch.bfloat16)
        packed = pack_linear_weight(torch.randn(1536, 576, dtype=torch.bfloat16) * 0.02, bf16_kernel=True)
        gemm = alternate({"gemm": lambda: packed_linear(x, packed, None)}, args.rounds * 2, clock)["gemm"]
    limit = 2 * 2048 * 576 * 1536 / min(gemm) / 1e9
    flops = step_flops(model)
    tokens = PROMPTS * PROMPT_LEN
    attn_ms = {mode: statistics.median(attn[mode]) * 1e3 for mode in MODES}
    step_ms = {mode: statistics.median(steps[mode]) * 1e3 for mode in MODES}
    step_gflops = {mode: flops / step_ms[mode] / 1e6 for mode in MODES}
    results.update({
        "gemm_limit_gflops": limit, "step_gflop": flops / 1e9, "attention_ms": attn_ms,
        "attention_speedup": attn_ms["sdpa"] / attn_ms["kernel"], "step_ms": step_ms,
        "step_tok_s": {mode: tokens / step_ms[mode] * 1e3 for mode in MODES}, "step_gflops": step_gflops,
        "step_gemm_fraction": {mode: step_gflops[mode] / limit for mode in MODES},
        "step_speedup": step_ms["sdpa"] / step_ms["kernel"],
        "rounds_s": {"attention": attn, "step": steps, "gemm": gemm}, "load_after": os.getloadavg()})
    print(f"{args.threads} thread(s), {results['clock']} clock; bf16 GEMM limit {limit:.0f} GFLOP/s")
    print(f"attention of one layer, {PROMPTS} x {PROMPT_LEN} fresh tokens: kernel {attn_ms['kernel']:.2f} ms, "
          f"sdpa {attn_ms['sdpa']:.2f} ms ({results['attention_speedup']:.2f}x)")
    print(f"model step, {PROMPTS} x {PROMPT_LEN} tokens ({flops / 1e9:.0f} GFLOP):")
    for mode in MODES:
        print(f"  {mode:<7} median {step_ms[mode]:7.1f} ms  {results['step_tok_s'][mode]:6.0f} tok/s  "
              f"{step_gflops[mode]:5.0f} GFLOP/s ({results['step_gemm_fraction'][mode]:4.0%} of the GEMM limit)")
    print(f"  sdpa / kernel time: {results['step_speedup']:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
