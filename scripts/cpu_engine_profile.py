"""Where an offline generate's wall time goes on CPU: the model forward, the logits, sampling, input
preparation, and the engine's own host work (scheduling, output processing) as the remainder.

Times are taken by wrapping the model runner's pieces with wall clocks (no profiler overhead), for
greedy, ignore_eos workloads like the side-by-side benchmark's (random prompt token ids).

    .venv/bin/python scripts/cpu_engine_profile.py --threads 2
    .venv/bin/python scripts/cpu_engine_profile.py --threads 2 --workloads "128 x 10 x 256"

--compare SWITCH measures one switch inside the same generate instead: decode steps alternate it on
and off, and the forward's wall and process CPU time are compared step against neighbouring step
(medians per context range), so both arms see the same machine state and nearly the same contexts:

    .venv/bin/python scripts/cpu_engine_profile.py --threads 2 --workloads "128 x 10 x 256" --compare decode-prefetch
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm import LLM, SamplingParams  # noqa: E402
from folovllm.worker import model_runner  # noqa: E402

# (name, prompts, prompt tokens, output tokens)
WORKLOADS = [("decode 128 x 10 x 64", 128, 10, 64), ("one stream 1 x 10 x 64", 1, 10, 64),
             ("prefill 16 x 512 x 4", 16, 512, 4), ("decode 128 x 10 x 256", 128, 10, 256)]
DEFAULT_WORKLOADS = WORKLOADS[:3]


def set_decode_prefetch(llm: LLM, on: bool) -> None:
    """The CPU attention backend's decode prefetching (FOLOVLLM_CPU_DECODE_PREFETCH), on the live backend."""
    layers = llm.llm_engine.worker.runner.model.model.layers
    for backend in {id(layer.self_attn.backend): layer.self_attn.backend for layer in layers}.values():
        if not hasattr(backend, "_decode_prefetch"):
            raise SystemExit("--compare decode-prefetch needs the cpu attention backend")
        backend._decode_prefetch = on


# switches --compare can flip between decode steps: name -> setter(llm, on)
SWITCHES = {"decode-prefetch": set_decode_prefetch}
CONTEXT_RANGES = [(0, 64), (64, 128), (128, 192), (192, 1 << 30)]


def timed(fn, name: str, totals: dict[str, float]):  # noqa: ANN001, ANN201
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start
    return wrapper


def alternating(forward, flip, log: list):  # noqa: ANN001, ANN201
    """``forward`` with the switch flipped before every decode-only step (one token per sequence), each
    such step's wall and process CPU time logged with the switch's state and the batch's longest context."""
    state = {"on": False}

    @functools.wraps(forward)
    def wrapper(batch):  # noqa: ANN001, ANN202
        meta = batch.attn_metadata
        if meta is None or any(q != 1 for q in meta.query_lens):
            return forward(batch)
        state["on"] = not state["on"]
        flip(state["on"])
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return forward(batch)
        finally:
            log.append((state["on"], max(meta.seq_lens_list), time.perf_counter() - wall, time.process_time() - cpu))
            flip(True)
    return wrapper


def report_compare(switch: str, log: list[tuple[bool, int, float, float]]) -> dict:
    """Median forward ms/step with the switch off and on, per context range, and off / on."""
    out = {}
    for lo, hi in CONTEXT_RANGES:
        arms = {on: [(w, c) for flag, ctx, w, c in log if flag is on and lo <= ctx < hi] for on in (False, True)}
        if not arms[False] or not arms[True]:
            continue
        row = {}
        for i, clock in enumerate(("wall", "cpu")):
            off, on = (statistics.median(x[i] for x in arms[a]) * 1e3 for a in (False, True))
            row[clock] = {"off_ms": off, "on_ms": on, "off_over_on": off / on}
        label = f"context {lo}-{hi - 1}" if hi < 1 << 30 else f"context {lo}+"
        out[label] = row | {"steps": len(arms[False]) + len(arms[True])}
        print(f"  {switch} {label:<16} wall off {row['wall']['off_ms']:7.2f} on {row['wall']['on_ms']:7.2f} ms "
              f"({row['wall']['off_over_on']:.2f}x)   cpu off {row['cpu']['off_ms']:7.2f} on "
              f"{row['cpu']['on_ms']:7.2f} ms ({row['cpu']['off_over_on']:.2f}x)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the results here (JSON)")
    parser.add_argument("--no-greedy-head", action="store_true",
                        help="greedy steps through the logits and the sampler (cpu_greedy_head off)")
    parser.add_argument("--workloads", nargs="+", metavar="NAME",
                        help="run the workloads whose names contain these (default: the first three of "
                             + ", ".join(repr(w[0]) for w in WORKLOADS) + ")")
    parser.add_argument("--compare", choices=sorted(SWITCHES),
                        help="alternate this switch on/off between decode steps and compare the forward times")
    args = parser.parse_args()
    workloads = DEFAULT_WORKLOADS if not args.workloads else [
        w for w in WORKLOADS if any(name in w[0] for name in args.workloads)]
    if not workloads:
        raise SystemExit(f"no workload matches {args.workloads}")
    llm = LLM(dtype="bfloat16", num_threads=args.threads, max_model_len=2048, seed=0,
              cpu_greedy_head=not args.no_greedy_head)
    runner = llm.llm_engine.worker.runner
    totals: dict[str, float] = collections.Counter()
    model = runner.model
    runner._forward = timed(runner._forward, "forward", totals)
    compare: list[tuple[bool, int, float, float]] = []  # (switch on, max context, wall s, process CPU s)
    if args.compare:
        runner._forward = alternating(runner._forward, functools.partial(SWITCHES[args.compare], llm), compare)
    model.compute_logits = timed(model.compute_logits, "logits", totals)
    runner.sampler.sample = timed(runner.sampler.sample, "sample", totals)
    if runner.greedy_head is not None:  # plain-greedy steps: logits and argmax in one kernel (cpu_greedy_head)
        runner.greedy_head = timed(runner.greedy_head, "greedy head", totals)
    runner._prepare = timed(runner._prepare, "prepare inputs", totals)  # built anew or in the decode buffers
    model_runner.build_sampling_batch = timed(model_runner.build_sampling_batch, "sampling batch", totals)
    runner.launch = timed(runner.launch, "runner.launch", totals)
    rng = random.Random(0)
    results = {"threads": args.threads, "load_before": os.getloadavg(), "workloads": {}}
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    for name, num, prompt_len, out_len in workloads:
        prompts = [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(prompt_len)]} for _ in range(num)]
        params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
        llm.reset_prefix_cache()
        totals.clear()
        compare.clear()
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
        if args.compare:
            results["workloads"][name]["compare"] = report_compare(args.compare, compare)
    results["load_after"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
