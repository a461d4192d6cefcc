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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm import LLM  # noqa: E402
from folovllm.bench.switch_ab import (  # noqa: E402
    SwitchWorkload,
    add_switch_args,
    chosen_workloads,
    compare_switch,
    write_switch_results,
)

WORKLOADS = {
    "decode_64": SwitchWorkload(64, 10, 128, 128),
    "decode_128": SwitchWorkload(128, 10, 256, 256),
    "variable_64": SwitchWorkload(64, 10, 16, 256),
    "one_stream": SwitchWorkload(1, 10, 128, 128),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_switch_args(parser, WORKLOADS)
    args = parser.parse_args()
    names = chosen_workloads(args.workloads, WORKLOADS)
    engines = {on: LLM(dtype="bfloat16", num_threads=args.threads, max_model_len=2048, seed=0,
                       cpu_greedy_head=on, enable_prefix_caching=False)  # every round prefills anew
               for on in (True, False)}
    if engines[True].llm_engine.worker.runner.greedy_head is None:
        raise SystemExit("cpu_greedy_head is off here (see the log): build it with `make kernels`")
    write_switch_results(compare_switch(engines, WORKLOADS, names, args.rounds, args.threads), args.out)


if __name__ == "__main__":
    main()
