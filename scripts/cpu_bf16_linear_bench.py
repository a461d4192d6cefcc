"""The bf16 linear kernel (``cpu_bf16_linear``) against oneDNN's prepacked linears, end to end.

Loads the default model twice in one process (the switch on and off) and times, in alternating rounds,
offline generates of greedy ignore_eos workloads with random prompt token ids: one stream (ms per
output token, 1 x 10 x 128 as the side-by-side benchmark's), a decode batch (output tok/s) and a
prefill (prompt tok/s). Prints medians, the on/off ratio and whether the greedy tokens agree.

    .venv/bin/python scripts/cpu_bf16_linear_bench.py --threads 2 --rounds 5
    .venv/bin/python scripts/cpu_bf16_linear_bench.py --workloads one_stream --rounds 9
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

# name -> (requests, prompt tokens, output tokens, metric)
WORKLOADS = {
    "one_stream": (1, 10, 128, "ms_per_output_token"),
    "decode_64": (64, 10, 64, "output_tok_s"),
    "prefill_16x512": (16, 512, 1, "input_tok_s"),
}


def run(llm: LLM, prompts: list[list[int]], output_len: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outputs]


def metric(name: str, seconds: float, requests: int, prompt_len: int, output_len: int) -> float:
    if name == "ms_per_output_token":
        return seconds * 1000 / (requests * output_len)
    if name == "output_tok_s":
        return requests * output_len / seconds
    return requests * prompt_len / seconds


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
                       max_num_batched_tokens=2048, cpu_bf16_linear=on,
                       enable_prefix_caching=False)  # every round prefills its prompts anew
               for on in (True, False)}
    if not engines[True].llm_engine.config.cpu_bf16_linear:
        raise SystemExit("cpu_bf16_linear resolved to off here (see the log): build it with `make kernels`")
    rng = random.Random(0)
    prompts = {n: [[rng.randrange(1000, 20000) for _ in range(WORKLOADS[n][1])] for _ in range(WORKLOADS[n][0])]
               for n in names}
    for llm in engines.values():  # warm-up
        run(llm, prompts[names[0]][:1], 4)
    results: dict = {"threads": args.threads, "rounds": args.rounds, "load_before": os.getloadavg(), "workloads": {}}
    samples = {n: {True: [], False: []} for n in names}
    tokens: dict = {n: {} for n in names}
    for r in range(args.rounds):
        for name in names:
            requests, prompt_len, output_len, kind = WORKLOADS[name]
            order = (True, False) if r % 2 == 0 else (False, True)  # alternate which goes first
            for on in order:
                seconds, tokens[name][on] = run(engines[on], prompts[name], output_len)
                samples[name][on].append(metric(kind, seconds, requests, prompt_len, output_len))
    results["load_after"] = os.getloadavg()
    for name in names:
        kind = WORKLOADS[name][3]
        on, off = (statistics.median(samples[name][s]) for s in (True, False))
        results["workloads"][name] = {"metric": kind, "on": on, "off": off, "on_over_off": on / off,
                                      "samples_on": samples[name][True], "samples_off": samples[name][False],
                                      "same_greedy_tokens": tokens[name][True] == tokens[name][False]}
        print(f"{name:15s} {kind:20s} on {on:8.2f}  off {off:8.2f}  on/off {on / off:5.3f}  "
              f"same tokens: {tokens[name][True] == tokens[name][False]}")
    print(f"load average before {results['load_before'][0]:.1f}, after {results['load_after'][0]:.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
