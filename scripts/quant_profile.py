"""Where a one-stream decode step of the default model goes: torch.profiler op self times per variant.

    .venv/bin/python scripts/quant_profile.py --out docs/results/quant-profile.json

Profiles ``--steps`` decode steps (forward + logits, one stream at a 64-token context) of bf16 and of
the 4-bit variants (GPTQ g128 and the GGUF file's Q4_1 kept packed, each with the LM head in bf16 and
in int8), and reports per variant: the median step time unprofiled, and the ops with the largest self
CPU time per step, the logits matmul counted apart (its share of the step is what an int8 head saves).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm.model.loader import default_model_path, load_model  # noqa: E402
from scripts.quant_bench import StepTimer, write_gptq_folder  # noqa: E402

LOGITS = "logits"  # the record_function label around compute_logits


def profile_steps(timer: StepTimer, steps: int, context: int) -> dict[str, tuple[int, float]]:
    """op name -> (calls per step, self CPU ms per step) over ``steps`` decode steps."""
    model = timer.model
    logits = model.compute_logits

    def labelled(hidden: torch.Tensor) -> torch.Tensor:
        with record_function(LOGITS):
            return logits(hidden)

    model.compute_logits = labelled
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                timer.seconds(1, context)
    finally:
        del model.compute_logits  # the instance attribute shadowed the method
    ops = {}
    for event in prof.key_averages():
        total_ms = (event.cpu_time_total if event.key == LOGITS else event.self_cpu_time_total) / 1000
        ops[event.key] = (event.count // steps, total_ms / steps)
    return ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gptq = write_gptq_folder(Path(tempfile.mkdtemp(prefix="quant-profile-")) / "gptq4", 4, 128)
    gguf = default_model_path()
    variants = {  # name: (path, load_quantized, quantize_lm_head)
        "bf16": (gguf, False, "off"),
        "gptq-4bit-g128": (gptq, False, "off"),
        "gptq-4bit-g128-int8head": (gptq, False, "on"),
        "gguf-q4-packed": (gguf, True, "off"),
        "gguf-q4-packed-int8head": (gguf, True, "on"),
    }
    result = {"threads": torch.get_num_threads(), "steps": args.steps, "context": args.context,
              "load_average_at_start": list(os.getloadavg()), "variants": {}}
    for name, (path, packed, head) in variants.items():
        model = load_model(path, dtype=torch.bfloat16, device="cpu", cpu_prepack=True, load_quantized=packed,
                           quantize_lm_head=head)
        timer = StepTimer(model, args.context, 1)
        for _ in range(3):  # warm-up
            timer.seconds(1, args.context)
        step_ms = 1000 * statistics.median(timer.seconds(1, args.context) for _ in range(args.steps))
        ops = profile_steps(timer, args.steps, args.context)
        top = sorted(((k, v) for k, v in ops.items() if k != LOGITS), key=lambda kv: -kv[1][1])[:args.top]
        logits_ms = ops.get(LOGITS, (0, 0.0))[1]
        result["variants"][name] = {"step_ms": step_ms, "logits_ms": logits_ms,
                                    "top_ops": [{"op": k, "calls": c, "self_ms": ms} for k, (c, ms) in top]}
        print(f"{name}: step {step_ms:.2f} ms (unprofiled median); logits {logits_ms:.2f} ms per step (profiled)")
        for op, (calls, ms) in top:
            print(f"    {op:45s} {calls:4d} calls {ms:7.3f} ms")
        del model, timer
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
