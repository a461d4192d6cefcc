"""Where an offline generate's wall time goes on CPU: the model forward, the logits, sampling, input
preparation, and the engine's own host work (scheduling, output processing) as the remainder.

Times are taken by wrapping the model runner's pieces with wall clocks (no profiler overhead), for
greedy, ignore_eos workloads like the side-by-side benchmark's (random prompt token ids).

    .venv/bin/python scripts/cpu_engine_profile.py --threads 2
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm import LLM, SamplingParams  # noqa: E402
from folovllm.worker import model_runner  # noqa: E402

# (name, prompts, prompt tokens, output tokens)
WORKLOADS = [("decode 128 x 10 x 64", 128, 10, 64), ("one stream 1 x 10 x 64", 1, 10, 64),
             ("prefill 16 x 512 x 4", 16, 512, 4)]


def timed(fn, name: str, totals: dict[str, float]):  # noqa: ANN001, ANN201
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the results here (JSON)")
    parser.add_argument("--no-greedy-head", action="store_true",
                        help="greedy steps through the logits and the sampler (cpu_greedy_head off)")
    args = parser.parse_args()
    llm = LLM(dtype="bfloat16", num_threads=args.threads, max_model_len=2048, seed=0,
              cpu_greedy_head=not args.no_greedy_head)
    runner = llm.llm_engine.worker.runner
    totals: dict[str, float] = collections.Counter()
    model = runner.model
    runner._forward = timed(runner._forward, "forward", totals)
    model.compute_logits = timed(model.compute_logits, "logits", totals)
    runner.sampler.sample = timed(runner.sampler.sample, "sample", totals)
    if runner.greedy_head is not None:  # plain-greedy steps: logits and argmax in one kernel (cpu_greedy_head)
        runner.greedy_head = timed(runner.greedy_head, "greedy head", totals)
    model_runner.prepare_step_batch = timed(model_runner.prepare_step_batch, "prepare inputs", totals)
    model_runner.build_sampling_batch = timed(model_runner.build_sampling_batch, "sampling batch", totals)
    runner.launch = timed(runner.launch, "runner.launch", totals)
    rng = random.Random(0)
    results = {"threads": args.threads, "load_before": os.getloadavg(), "workloads": {}}
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    for name, num, prompt_len, out_len in WORKLOADS:
        prompts = [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(prompt_len)]} for _ in range(num)]
        params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
        llm.reset_prefix_cache()
        totals.clear()
        steps_before = llm.llm_engine.stats.num_steps
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        steps = llm.llm_engine.stats.num_steps - steps_before
        parts = dict(totals)
        parts["engine host (rest)"] = wall - parts.get("runner.launch", 0.0)
        parts["runner other"] = parts.pop("runner.launch", 0.0) - sum(
            parts.get(k, 0.0) for k in ("forward", "logits", "sample", "greedy head", "prepare inputs",
                                        "sampling batch"))
        results["workloads"][name] = {"wall_s": wall, "steps": steps, "parts_s": parts}
        print(f"\n{name}: {wall:.2f} s, {steps} steps, {wall / steps * 1e3:.1f} ms/step")
        for part, secs in sorted(parts.items(), key=lambda kv: -kv[1]):
            print(f"  {part:<20} {secs * 1e3 / steps:8.2f} ms/step  {secs / wall:5.1%}")
    results["load_after"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
