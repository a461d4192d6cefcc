"""``folovllm bench invariance``: the batch-invariant mode measured.

    folovllm bench invariance needle --tiers native,avx512,avx2,none --out docs/results/batch-invariance-needle.json
    folovllm bench invariance cost --rounds 3 --out docs/results/batch-invariance-cost.json

needle: for each CPU tier (``FOLOVLLM_CPU_ISA``, a process each: torch reads its cap once), dtype and mode
(off, on), a model generates four needle prompts (``--needle-lens`` tokens; two greedy rows with top-3 logprobs,
one seeded random row with them, one plain greedy row) alone, then inside shuffled batches of ``--batches``
random prompts of mixed lengths and settings, with chunked prefill of ``--chunk`` tokens (small enough to split
the needles). A case is one needle in one batch: its tokens, and its tokens and logprobs, compared with ``==``
to the needle alone. The verdict: the mode on differs in no case.

cost: ``folovllm bench throughput --workload W`` with and without ``--batch-invariant``, each a process of its
own, in alternating order round by round, per tier; each side's median and their ratio (the bar: on >= 0.8x
off), in the on/off result format of ``bench switch``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from folovllm import envs
from folovllm.bench.results import write_results
from folovllm.engine.args import add_model_positional, merge_model_tag

TIERS = ("native", "amx", "avx512_bf16", "avx512", "avx2", "none")
DTYPES = ("bfloat16", "float32")
# the workloads ``cost`` times and the rate each is scored by (prefill-heavy's output rate has the same ratio)
COST_METRICS = {"decode-heavy": "output_tok_s", "prefill-heavy": "input_tok_s", "variable": "output_tok_s"}
COST_BAR = 0.8
CLI = [sys.executable, "-m", "folovllm.entrypoints.cli"]


def _choices(allowed: tuple[str, ...] | dict[str, str]):
    def parse(text: str) -> list[str]:
        items = text.split(",")
        bad = [x for x in items if x not in allowed]
        if bad or not text:
            raise argparse.ArgumentTypeError(f"takes a comma-separated list of {', '.join(allowed)}; got {text!r}")
        return items
    return parse


def _counts(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"takes a comma-separated list of positive integers; got {text!r}")
    return values


def _positive(text: str) -> int:
    values = _counts(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"takes one positive integer; got {text!r}")
    return values[0]


def add_invariance_args(parser: argparse.ArgumentParser) -> None:
    modes = parser.add_subparsers(dest="invariance_mode", required=True)
    needle = modes.add_parser("needle", help="needles alone vs inside batches, per tier, dtype and mode")
    cost = modes.add_parser("cost", help="bench throughput with the mode on vs off, alternating rounds")
    for sub in (needle, cost):
        add_model_positional(sub)
        sub.add_argument("--model", default=None, help="the model (default: the packaged SmolLM2-135M)")
        sub.add_argument("--tiers", type=_choices(TIERS), default="native",
                         help=f"comma-separated FOLOVLLM_CPU_ISA caps, a process each: {', '.join(TIERS)}")
        sub.add_argument("--out", help="write the results here (JSON: a list of results, this run's one)")
        sub.add_argument("--append", action="store_true",
                         help="add this run's result to the list already in --out (pieces of one measurement)")
    needle.add_argument("--dtypes", type=_choices(DTYPES), default=",".join(DTYPES))
    needle.add_argument("--chunk", type=_positive, default=64, help="max_num_batched_tokens (splits the needles)")
    needle.add_argument("--tokens", type=_positive, default=48, help="tokens each needle generates")
    needle.add_argument("--batches", type=_counts, default="8,24,64", help="batch sizes, needles included")
    needle.add_argument("--needle-lens", type=_counts, default="20,75,150,300", help="the four needles' lengths")
    needle.add_argument("--one", help=argparse.SUPPRESS)  # "dtype,on|off": one case, in this process
    cost.add_argument("--workloads", type=_choices(COST_METRICS), default="decode-heavy,prefill-heavy")
    cost.add_argument("--rounds", type=_positive, default=3)
    cost.add_argument("--bench-args", default="", help="more `bench throughput` flags, for both sides")


def reproduce_command(args: argparse.Namespace) -> str:
    """The ``folovllm bench invariance`` command line that makes this result (every option spelled out)."""
    words = ["folovllm", "bench", "invariance", args.invariance_mode, *([args.model] if args.model else []),
             "--tiers", ",".join(args.tiers)]
    if args.invariance_mode == "needle":
        words += ["--dtypes", ",".join(args.dtypes), "--chunk", str(args.chunk), "--tokens", str(args.tokens),
                  "--batches", ",".join(map(str, args.batches)), "--needle-lens", ",".join(map(str, args.needle_lens))]
    else:
        words += ["--workloads", ",".join(args.workloads), "--rounds", str(args.rounds)]
        words += ["--bench-args", args.bench_args] if args.bench_args else []
    return shlex.join(words + (["--out", args.out] if args.out else []) + (["--append"] if args.append else []))


def tier_env(tier: str) -> dict[str, str]:
    """This process's environment with ``tier`` as the CPU cap (native: none set) and this checkout importable."""
    own = envs.torch_caps(os.environ.get("FOLOVLLM_CPU_ISA"))  # what this process's cap set for torch: not theirs
    env = {k: v for k, v in os.environ.items() if k != "FOLOVLLM_CPU_ISA" and own.get(k) != v}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env if tier == "native" else {**env, "FOLOVLLM_CPU_ISA": tier}


# -- needle -------------------------------------------------------------------------------------------------

def needle_case(model: str | None, dtype: str, invariant: bool, chunk: int, tokens: int, batch_sizes: list[int],
                needle_lens: list[int]) -> dict[str, Any]:
    """One engine (this process's tier): the needles alone, then in each batch; the differences counted."""
    from folovllm import LLM, SamplingParams
    from folovllm.bench.workloads import special_token_ids

    longest = max(needle_lens)
    llm = LLM(model, dtype=dtype, max_num_batched_tokens=chunk, max_model_len=longest + 2 * tokens,
              enable_prefix_caching=False, batch_invariant=invariant)
    specials = special_token_ids(llm.tokenizer)
    ids = [i for i in range(min(len(llm.tokenizer), llm.llm_engine.vocab_size)) if i not in specials]
    rng = random.Random(0)
    needles = [[rng.choice(ids) for _ in range(n)] for n in needle_lens]
    params = [SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=tokens, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)][:len(needles)]

    def key(out: Any) -> tuple:
        completion = out.outputs[0]
        return tuple(completion.token_ids), tuple(tuple(sorted((t, lp.logprob) for t, lp in step.items()))
                                                  for step in completion.logprobs or ())

    def run(batch: list[tuple[list[int], Any]]) -> list[tuple]:
        outs = llm.generate([{"prompt_token_ids": p} for p, _ in batch], [s for _, s in batch], use_tqdm=False)
        return [key(o) for o in outs]

    alone = [run([(n, p)])[0] for n, p in zip(needles, params)]
    cases = token_diff = any_diff = 0
    for size in batch_sizes:
        batch: list[tuple[list[int], Any, int | None]] = [(n, p, i) for i, (n, p) in enumerate(zip(needles, params))]
        for _ in range(size - len(needles)):
            prompt = [rng.choice(ids) for _ in range(rng.randrange(5, longest))]
            greedy = rng.random() < 0.5
            length = rng.randrange(1, 2 * tokens)
            batch.append((prompt, SamplingParams(temperature=0.0 if greedy else 1.0, max_tokens=length, ignore_eos=True,
                                                 logprobs=rng.choice([None, 1, 5])), None))
        rng.shuffle(batch)
        for (_, _, i), out in zip(batch, run([(p, s) for p, s, _ in batch])):
            if i is not None:
                cases += 1
                token_diff += out[0] != alone[i][0]
                any_diff += out != alone[i]
    return {"dtype": dtype, "batch_invariant": invariant, "platform": llm.llm_engine.platform_info, "cases": cases,
            "tokens_differ": token_diff, "tokens_or_logprobs_differ": any_diff}


def needle_child(args: argparse.Namespace, tier: str, dtype: str, mode: str) -> dict[str, Any]:
    """One case in a process of its own at ``tier``; its last stdout line is the case's JSON."""
    command = [*CLI, "bench", "invariance", "needle", *(["--model", args.model] if args.model else []),
               "--one", f"{dtype},{mode}", "--chunk", str(args.chunk), "--tokens", str(args.tokens),
               "--batches", ",".join(map(str, args.batches)), "--needle-lens", ",".join(map(str, args.needle_lens))]
    done = subprocess.run(command, env=tier_env(tier), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"needle case {tier} {dtype} {mode} failed:\n{done.stderr[-3000:]}")
    return {"tier": tier, **json.loads(done.stdout.strip().splitlines()[-1])}


def judge_needle(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict: the mode on identical in every case (the bar), and where the default mode moved."""
    on = [c for c in cases if c["batch_invariant"]]
    off = [c for c in cases if not c["batch_invariant"]]
    return {"on_identical_everywhere": bool(on) and all(c["tokens_or_logprobs_differ"] == 0 for c in on),
            "on_differing_cases": sum(c["tokens_or_logprobs_differ"] for c in on),
            "off_differing_cases": sum(c["tokens_or_logprobs_differ"] for c in off),
            "off_token_differing_cases": sum(c["tokens_differ"] for c in off),
            "cases_per_mode": sum(c["cases"] for c in on)}


def format_needle(cases: list[dict[str, Any]], verdict: dict[str, Any]) -> str:
    lines = [f"{'tier':<12}{'dtype':<10}{'mode':<6}{'tokens differ':>15}{'tokens or logprobs':>20}"]
    for c in cases:
        lines.append(f"{c['tier']:<12}{c['dtype']:<10}{'on' if c['batch_invariant'] else 'off':<6}"
                     f"{c['tokens_differ']:>9} / {c['cases']:<3}{c['tokens_or_logprobs_differ']:>14} / {c['cases']:<3}")
    lines.append("mode on identical in every case: " + ("yes" if verdict["on_identical_everywhere"] else
                                                        f"NO ({verdict['on_differing_cases']} cases differ)"))
    return "\n".join(lines)


def run_needle(args: argparse.Namespace, checkpoint: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
    """Every case, each in a process of its own; ``checkpoint`` gets the result so far after each one."""
    if len(args.needle_lens) != 4:
        raise ValueError(f"--needle-lens takes four lengths (one per needle), got {args.needle_lens}")
    if min(args.batches) <= len(args.needle_lens):
        raise ValueError(f"--batches: each batch holds the {len(args.needle_lens)} needles and random prompts "
                         f"beside them; got {args.batches}")
    if args.one:
        dtype, mode = args.one.split(",")
        print(json.dumps(needle_case(args.model, dtype, mode == "on", args.chunk, args.tokens, args.batches,
                                     args.needle_lens)))
        return None
    cases: list[dict[str, Any]] = []

    def result(complete: bool) -> dict[str, Any]:
        return {"name": "batch-invariance-needle", "command": reproduce_command(args), "complete": complete,
                "chunk": args.chunk, "tokens": args.tokens, "batches": args.batches,
                "needle_lens": args.needle_lens, "verdict": judge_needle(cases), "cases": cases}

    for tier in args.tiers:
        for dtype in args.dtypes:
            for mode in ("off", "on"):
                cases.append(needle_child(args, tier, dtype, mode))
                print(json.dumps(cases[-1]), flush=True)
                checkpoint(result(complete=False))
    print(format_needle(cases, judge_needle(cases)))
    return result(complete=True)


# -- cost ---------------------------------------------------------------------------------------------------

def bench_command(args: argparse.Namespace, workload: str, invariant: bool, out: str) -> list[str]:
    return [*CLI, "bench", "throughput", *([args.model] if args.model else []), "--workload", workload,
            *(["--batch-invariant"] if invariant else []), *shlex.split(args.bench_args), "--output-json", out]


def summarize(workload: str, samples: dict[bool, list[float]], platform: dict[str, Any] | None,
              dtype: str | None = None) -> dict[str, Any]:
    """One workload's row in the ``bench switch`` format: each side's median, their ratio, the bar."""
    on, off = statistics.median(samples[True]), statistics.median(samples[False])
    return {"metric": COST_METRICS[workload], "on": on, "off": off, "on_over_off": on / off,
            "samples_on": samples[True], "samples_off": samples[False], "meets_bar": on / off >= COST_BAR,
            "platform": platform, "dtype": dtype}


def run_cost(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        for tier in args.tiers:
            samples = {w: {True: [], False: []} for w in args.workloads}
            platform: dict[str, Any] | None = None
            dtype: str | None = None
            for r in range(args.rounds):
                for workload in args.workloads:
                    for on in ((False, True) if r % 2 == 0 else (True, False)):  # alternate who goes first
                        done = subprocess.run(bench_command(args, workload, on, out), env=tier_env(tier),
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                        if done.returncode != 0:
                            raise RuntimeError(f"bench throughput {workload} ({tier}) failed:\n{done.stderr[-3000:]}")
                        result = json.loads(Path(out).read_text())[0]
                        platform, dtype = result["platform"], result["dtype"]
                        samples[workload][on].append(result[COST_METRICS[workload]])
                        print(f"{tier} {workload} {'on ' if on else 'off'} {samples[workload][on][-1]:.1f}", flush=True)
            for workload in args.workloads:
                rows[f"{tier}:{workload}"] = summarize(workload, samples[workload], platform, dtype)
    for name, row in rows.items():
        print(f"{name:28s} {row['metric']:14s} on {row['on']:8.1f}  off {row['off']:8.1f}  "
              f"on/off {row['on_over_off']:5.3f}  {'meets' if row['meets_bar'] else 'MISSES'} the {COST_BAR} bar")
    sides = {w: [shlex.join(["folovllm", *bench_command(args, w, on, "OUT.json")[len(CLI):]]) for on in (False, True)]
             for w in args.workloads}
    return {"name": "batch-invariance-cost", "command": reproduce_command(args), "rounds": args.rounds,
            "bar": COST_BAR, "order": "alternating: off first in even rounds, on first in odd ones",
            "sides": sides, "workloads": rows}


def results_writer(out: str | None, append: bool) -> Callable[[dict[str, Any]], None]:
    """Writes ``out`` as a list of results: this run's alone, or (``append``) after those there when the run
    began; called again as the run goes, it replaces its own entry (a run cut short keeps what it measured)."""
    if not out:
        return lambda result: None
    earlier = json.loads(Path(out).read_text()) if append and Path(out).exists() else []
    return lambda result: write_results([*earlier, result], out)


def run_bench_invariance(args: argparse.Namespace) -> dict[str, Any] | None:
    merge_model_tag(args)
    if args.append and not args.out:
        raise ValueError("--append adds to the list in --out: give --out")
    write = results_writer(args.out, args.append)
    result = run_needle(args, write) if args.invariance_mode == "needle" else run_cost(args)
    if result is not None:
        write(result)
    return result
