"""Model step time with the fused CPU ops on vs off, in one process, alternating rounds.

Two copies of the default model (SmolLM2-135M, bfloat16, prepacked linears, cpu attention kernel), one
built with ``cpu_fused_ops``; each round times one step of each case on both, in turn. Also counts the
top-level aten/custom ops a step dispatches (torch.profiler), per layer.

    .venv/bin/python scripts/cpu_fused_bench.py --threads 2 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_attention_bench import BLOCK_SIZE, step_inputs  # noqa: E402
from folovllm.model.loader import default_model_path, load_model  # noqa: E402

# (name, sequences, tokens each computes this step, tokens each has cached before it)
CASES = [("decode batch 1", 1, 1, 255), ("decode batch 64", 64, 1, 255), ("prefill 1 x 512", 1, 512, 0)]


def top_level_ops(model: torch.nn.Module, args: tuple) -> int:
    """Ops the step dispatches from Python (nested ops of a composite not counted)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(*args)
    events = prof.events()
    return sum(1 for e in events if e.cpu_parent is None and "::" in e.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the results here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {fused: load_model(default_model_path(), dtype=torch.bfloat16, device="cpu", attn_backend="cpu",
                                cpu_prepack=True, cpu_fused_ops=fused) for fused in (True, False)}
    arch = models[True].arch
    results = {"threads": args.threads, "rounds": args.rounds, "load_before": os.getloadavg(), "cases": []}
    for name, num_seqs, q_len, cached in CASES:
        ids, positions, meta = step_inputs(num_seqs, q_len, cached, arch.vocab_size)
        shape = (meta.block_tables.numel(), BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim)
        caches = [(torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16))
                  for _ in range(arch.num_hidden_layers)]
        times: dict[bool, list[float]] = {True: [], False: []}
        ops = {}
        with torch.inference_mode():
            for fused, model in models.items():
                ops[fused] = top_level_ops(model, (ids, positions, caches, meta)) / arch.num_hidden_layers
            for round_ in range(args.rounds + 1):  # round 0 warms up
                for fused in ((True, False) if round_ % 2 else (False, True)):
                    start = time.perf_counter()
                    hidden = models[fused](ids, positions, caches, meta)
                    models[fused].compute_logits(hidden[-num_seqs:]).argmax(-1)
                    if round_:
                        times[fused].append(time.perf_counter() - start)
        on, off = statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3
        case = {"step": name, "fused_ms": on, "unfused_ms": off, "speedup": off / on,
                "ops_per_layer": {"fused": ops[True], "unfused": ops[False]}, "load": os.getloadavg()[0]}
        results["cases"].append(case)
        print(f"{name}: fused {on:.1f} ms, unfused {off:.1f} ms, {off / on:.2f}x; ops/layer "
              f"{ops[True]:.1f} vs {ops[False]:.1f}; load {case['load']:.2f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
