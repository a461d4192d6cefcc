"""The greedy LM head (``cpu_greedy_head``) against the logits + sampler path, end to end.

Loads the default model twice in one process (the switch on and off) and times, in alternating rounds,
offline generates of greedy ignore_eos workloads with random prompt token ids, shaped like the
side-by-side benchmark's decode workloads: 64 x 10 x 128, 128 x 10 x 256 and 64 x 10 x 16..256 (output
lengths spread evenly), plus one stream (1 x 10 x 128). Prints output tok/s medians, the on/off ratio
and whether the greedy tokens agree.

    .venv/bin/python scripts/cpu_greedy_head_bench.py --threads 2 --rounds 5
    .venv/bin/python scripts/cpu_greedy_head_bench.py --workloads decode_64 --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm import LLM, SamplingParams  # noqa: E402

# name -> (requests, prompt tokens, shortest output, longest output)
WORKLOADS = {
    "decode_64": (64, 10, 128, 128),
    "decode_128": (128, 10, 256, 256),
    "variable_64": (64, 10, 16, 256),
    "one_stream": (1, 10, 128, 128),
}


def output_lens(requests: int, shortest: int, longest: int) -> list[int]:
    """Evenly spread from shortest to longest (all equal when they are)."""
    if requests == 1:
        return [longest]
    return [shortest + (longest - shortest) * i // (requests - 1) for i in range(requests)]


def run(llm: LLM, prompts: list[list[int]], lens: list[int]) -> tuple[float, list[list[int]]]:
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--out", help="write the results here (JSON)")
    args = parser.parse_args()
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    engines = {on: LLM(dtype="bfloat16", num_threads=args.threads, max_model_len=2048, seed=0,
                       cpu_greedy_head=on, enable_prefix_caching=False)  # every round prefills anew
               for on in (True, False)}
    if engines[True].llm_engine.worker.runner.greedy_head is None:
        raise SystemExit("cpu_greedy_head is off here (see the log): build it with `make kernels`")
    rng = random.Random(0)
    prompts = {n: [[rng.randrange(1000, 20000) for _ in range(WORKLOADS[n][1])] for _ in range(WORKLOADS[n][0])]
               for n in names}
    lens = {n: output_lens(WORKLOADS[n][0], WORKLOADS[n][2], WORKLOADS[n][3]) for n in names}
    for llm in engines.values():  # warm-up
        run(llm, prompts[names[0]][:1], [4])
    results: dict = {"threads": args.threads, "rounds": args.rounds, "load_before": os.getloadavg(), "workloads": {}}
    samples = {n: {True: [], False: []} for n in names}
    tokens: dict = {n: {} for n in names}
    for r in range(args.rounds):
        for name in names:
            order = (True, False) if r % 2 == 0 else (False, True)  # alternate which goes first
            for on in order:
                seconds, tokens[name][on] = run(engines[on], prompts[name], lens[name])
                samples[name][on].append(sum(lens[name]) / seconds)
    results["load_after"] = os.getloadavg()
    for name in names:
        on, off = (statistics.median(samples[name][s]) for s in (True, False))
        results["workloads"][name] = {"metric": "output_tok_s", "on": on, "off": off, "on_over_off": on / off,
                                      "samples_on": samples[name][True], "samples_off": samples[name][False],
                                      "same_greedy_tokens": tokens[name][True] == tokens[name][False]}
        print(f"{name:12s} output tok/s on {on:8.1f}  off {off:8.1f}  on/off {on / off:5.3f}  "
              f"same tokens: {tokens[name][True] == tokens[name][False]}")
    print(f"load average before {results['load_before'][0]:.1f}, after {results['load_after'][0]:.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
