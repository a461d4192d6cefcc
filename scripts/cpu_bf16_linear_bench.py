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
    "one_stream": SwitchWorkload(1, 10, 128, 128, "ms_per_output_token"),
    "decode_64": SwitchWorkload(64, 10, 64, 64),
    "prefill_16x512": SwitchWorkload(16, 512, 1, 1, "input_tok_s"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_switch_args(parser, WORKLOADS)
    args = parser.parse_args()
    names = chosen_workloads(args.workloads, WORKLOADS)
    engines = {on: LLM(dtype="bfloat16", num_threads=args.threads, max_model_len=2048, seed=0,
                       max_num_batched_tokens=2048, cpu_bf16_linear=on,
                       enable_prefix_caching=False)  # every round prefills its prompts anew
               for on in (True, False)}
    if not engines[True].llm_engine.config.cpu_bf16_linear:
        raise SystemExit("cpu_bf16_linear resolved to off here (see the log): build it with `make kernels`")
    write_switch_results(compare_switch(engines, WORKLOADS, names, args.rounds, args.threads), args.out)


if __name__ == "__main__":
    main()
