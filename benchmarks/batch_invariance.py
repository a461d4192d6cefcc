"""Batch-invariant mode, measured: where the default mode moves a request's output with its company (the needle
test), and what the mode costs in throughput.

    .venv/bin/python benchmarks/batch_invariance.py needle --tiers native,avx512,avx2,none --out docs/results/batch-invariance-needle.json
    .venv/bin/python benchmarks/batch_invariance.py cost --rounds 3 --out docs/results/batch-invariance-cost.json

needle: for each CPU tier (``FOLOVLLM_CPU_ISA``, a process each), dtype and mode (off, on), the default model
generates four needle prompts (20 to 300 tokens; 48 tokens, top-3 logprobs: two greedy, one seeded random, one
plain greedy without logprobs) alone, then inside shuffled batches of 8, 24 and 64 random prompts of mixed
lengths and settings, with chunked prefill of ``--chunk`` tokens (small enough to split the needles); a case is
one needle in one batch: its tokens, and its tokens and logprobs, compared with ``==`` to the needle alone.

cost: ``folovllm bench throughput --workload W`` with and without ``--batch-invariant``, each a process of its
own, in alternating order round by round; medians of each side and their ratio (the bar: >= 0.8).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TIERS = ("native", "amx", "avx512_bf16", "avx512", "avx2", "none")
BATCH_SIZES = (8, 24, 64)
NEEDLE_LENGTHS = (20, 75, 150, 300)
# what ``cost`` reads from a bench throughput result, per workload
COST_METRICS = {"decode-heavy": ["output_tok_s"], "prefill-heavy": ["input_tok_s", "output_tok_s"]}
COST_BAR = 0.8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    needle = sub.add_parser("needle", help="the needle test at each tier, dtype and mode")
    needle.add_argument("--tiers", default="native", help=f"comma-separated: {', '.join(TIERS)}")
    needle.add_argument("--dtypes", default="bfloat16,float32")
    needle.add_argument("--chunk", type=int, default=64, help="max_num_batched_tokens (splits the needles)")
    needle.add_argument("--tokens", type=int, default=48)
    needle.add_argument("--batches", default=",".join(map(str, BATCH_SIZES)))
    needle.add_argument("--one", help=argparse.SUPPRESS)  # "dtype,mode": one case in this process
    cost = sub.add_parser("cost", help="throughput with the mode on vs off")
    cost.add_argument("--workloads", default=",".join(COST_METRICS))
    cost.add_argument("--rounds", type=int, default=3)
    cost.add_argument("--bench-args", default="", help="more `bench throughput` flags for both sides")
    for p in (needle, cost):
        p.add_argument("--out", help="write the results here (JSON)")
    args = parser.parse_args(argv)
    if args.command == "needle":
        bad = [t for t in args.tiers.split(",") if t not in TIERS]
        if bad:
            parser.error(f"--tiers takes {', '.join(TIERS)}; got {bad}")
        args.batch_sizes = [int(b) for b in args.batches.split(",")]
    else:
        bad = [w for w in args.workloads.split(",") if w not in COST_METRICS]
        if bad or args.rounds < 1:
            parser.error(f"--workloads takes {', '.join(COST_METRICS)} and --rounds must be positive; got {bad}")
    return args


# -- needle -------------------------------------------------------------------------------------------------

def needle_case(dtype: str, invariant: bool, chunk: int, tokens: int, batch_sizes: list[int]) -> dict[str, Any]:
    """One engine (this process's tier): the needles alone, then in each batch; the differences counted."""
    from folovllm import LLM, SamplingParams

    llm = LLM(None, dtype=dtype, max_num_batched_tokens=chunk, max_model_len=1024, enable_prefix_caching=False,
              batch_invariant=invariant)
    rng = random.Random(0)
    vocab = 49000  # the default model's ids that are plain text pieces (its specials sit below 17)
    needles = [[rng.randrange(17, vocab) for _ in range(n)] for n in NEEDLE_LENGTHS]
    params = [SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=tokens, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)]

    def key(out) -> tuple:
        completion = out.outputs[0]
        return tuple(completion.token_ids), tuple(tuple(sorted((t, lp.logprob) for t, lp in step.items()))
                                                  for step in completion.logprobs or ())

    def run(batch: list[tuple[list[int], Any]]) -> list[tuple]:
        outs = llm.generate([{"prompt_token_ids": p} for p, _ in batch], [s for _, s in batch], use_tqdm=False)
        return [key(o) for o in outs]

    alone = [run([(n, p)])[0] for n, p in zip(needles, params)]
    cases = token_diff = any_diff = 0
    for size in batch_sizes:
        batch = [(n, p, i) for i, (n, p) in enumerate(zip(needles, params))]
        for _ in range(size - len(needles)):
            prompt = [rng.randrange(17, vocab) for _ in range(rng.randrange(5, 300))]
            greedy = rng.random() < 0.5
            batch.append((prompt, SamplingParams(temperature=0.0 if greedy else 1.0, max_tokens=rng.randrange(1, 2 * tokens),
                                                 ignore_eos=True, logprobs=rng.choice([None, 1, 5])), None))
        rng.shuffle(batch)
        for (_, _, i), out in zip(batch, run([(p, s) for p, s, _ in batch])):
            if i is not None:
                cases += 1
                token_diff += out[0] != alone[i][0]
                any_diff += out != alone[i]
    return {"dtype": dtype, "batch_invariant": invariant, "platform": llm.llm_engine.platform_info, "cases": cases,
            "tokens_differ": token_diff, "tokens_or_logprobs_differ": any_diff}


def run_needle(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.one:
        dtype, mode = args.one.split(",")
        print(json.dumps(needle_case(dtype, mode == "on", args.chunk, args.tokens, args.batch_sizes)))
        return []
    results = []
    for tier in args.tiers.split(","):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if tier != "native":
            env["FOLOVLLM_CPU_ISA"] = tier
        for dtype in args.dtypes.split(","):
            for mode in ("off", "on"):
                command = [sys.executable, str(Path(__file__).resolve()), "needle", "--one", f"{dtype},{mode}",
                           "--chunk", str(args.chunk), "--tokens", str(args.tokens), "--batches", args.batches]
                done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                result = {"tier": tier, **json.loads(done.stdout.strip().splitlines()[-1])}
                print(json.dumps(result), flush=True)
                results.append(result)
    return results


# -- cost ---------------------------------------------------------------------------------------------------

def bench_command(workload: str, invariant: bool, extra: str, out: str) -> list[str]:
    return [sys.executable, "-m", "folovllm.entrypoints.cli", "bench", "throughput", "--workload", workload,
            *(["--batch-invariant"] if invariant else []), *extra.split(), "--output-json", out]


def summarize(runs: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    """Per workload and metric: each side's values and median, and the ratio of medians (on / off)."""
    summary = {}
    for workload, sides in runs.items():
        for metric in COST_METRICS[workload]:
            off = [r[metric] for r in sides["off"]]
            on = [r[metric] for r in sides["on"]]
            ratio = statistics.median(on) / statistics.median(off)
            summary[f"{workload}:{metric}"] = {"off": off, "on": on, "median_off": statistics.median(off),
                                               "median_on": statistics.median(on), "ratio": ratio,
                                               "meets_bar": ratio >= COST_BAR}
    return summary


def run_cost(args: argparse.Namespace) -> dict[str, Any]:
    workloads = args.workloads.split(",")
    runs: dict[str, dict[str, list[dict[str, float]]]] = {w: {"off": [], "on": []} for w in workloads}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    platform = None
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for workload in workloads:
                order = (False, True) if round_index % 2 == 0 else (True, False)  # alternate who goes first
                for invariant in order:
                    out = os.path.join(tmp, "result.json")
                    subprocess.run(bench_command(workload, invariant, args.bench_args, out), env=env, check=True,
                                   cwd=ROOT, stdout=subprocess.DEVNULL)
                    result = json.loads(Path(out).read_text())[0]
                    platform = result.get("platform", platform)
                    runs[workload]["on" if invariant else "off"].append(
                        {m: result[m] for m in COST_METRICS[workload]})
                    print(workload, "on" if invariant else "off", runs[workload]["on" if invariant else "off"][-1],
                          flush=True)
    commands = {w: [" ".join(bench_command(w, inv, args.bench_args, "OUT.json")[1:]) for inv in (False, True)]
                for w in workloads}
    return {"name": "batch-invariance-cost", "rounds": args.rounds, "bar": COST_BAR, "platform": platform,
            "commands": commands, "order": "alternating: off first in even rounds, on first in odd ones",
            "results": summarize(runs)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "needle":
        results: Any = run_needle(args)
        if args.one:
            return 0
        results = {"name": "batch-invariance-needle", "command": " ".join(["benchmarks/batch_invariance.py", *sys.argv[1:]]),
                   "chunk": args.chunk, "tokens": args.tokens, "batches": args.batch_sizes,
                   "needle_lengths": list(NEEDLE_LENGTHS), "cases": results}
    else:
        results = run_cost(args)
        results["command"] = " ".join(["benchmarks/batch_invariance.py", *sys.argv[1:]])
        print(json.dumps(results["results"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
