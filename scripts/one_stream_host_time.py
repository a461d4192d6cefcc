"""Host work per output token of one greedy stream through the whole engine, on one thread.

    .venv/bin/python scripts/one_stream_host_time.py --rounds 5 --out docs/results/one-stream-host-time.json

``LLM.generate`` of one greedy request (10 prompt tokens, ``--max-tokens`` out, ``ignore_eos``) on the default
model in bfloat16 and as a GPTQ 4-bit g128 checkpoint (written as ``scripts/quant_one_stream.py`` writes it),
each engine on one thread, taking turns round by round. Each output token's CPU time of that thread is split
into the decode steps' decoder layers (the C++ layer chain), the greedy LM head, the prompt's forward, and
the rest: the engine's and the model's Python per token (scheduling, step inputs, embedding and rotary
lookups, final norm, output processing, stats), called host work here. CPU time, not wall time, so that a
busy machine inflates it less; it still grows when other processes evict this one's caches.

``--switch-off`` adds, for each model, an engine built with ``FOLOVLLM_DECODE_INPUT_BUFFERS=off`` that takes
its turn in the same rounds: the switch's effect on host work, measured side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from folovllm import LLM, SamplingParams  # noqa: E402
from folovllm.model.loader import default_model_path  # noqa: E402
from folovllm.worker.decode_inputs import DECODE_INPUT_BUFFERS_ENV  # noqa: E402
from quant_bench import write_gptq_folder  # noqa: E402


def timed(fn, key: str, totals: Counter):
    """``fn`` adding its thread CPU time to ``totals[key]``."""
    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.thread_time() - start
    return wrapper


def instrument(llm: LLM, totals: Counter) -> None:
    """Times the layer chain, the greedy head and every forward of more than one token (the prompt's)."""
    runner = llm.llm_engine.worker.runner
    chain = runner.model.model.layer_chain
    if chain is None or runner.greedy_head is None:
        raise SystemExit("needs the layer chain and the greedy head (make kernels; an AVX-512 BF16 CPU)")
    chain._run = timed(chain._run, "chain", totals)
    runner.greedy_head = timed(runner.greedy_head, "head", totals)
    forward = runner._forward

    def prompt_forward(batch):
        if batch.input_ids.shape[0] == 1:
            return forward(batch)
        return timed(forward, "prompt", totals)(batch)
    runner._forward = prompt_forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--switch-off", action="store_true", help=f"also engines with {DECODE_INPUT_BUFFERS_ENV}=off")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    gptq = write_gptq_folder(Path(tempfile.mkdtemp(prefix="one-stream-host-")) / "gptq4", 4, 128)
    totals: Counter = Counter()
    engines: dict[str, LLM] = {}
    for switch in ("on", "off") if args.switch_off else ("on",):
        os.environ[DECODE_INPUT_BUFFERS_ENV] = switch
        suffix = "" if switch == "on" else "-buffers-off"
        for name, path in (("bf16", default_model_path()), ("gptq-4bit-g128", gptq)):
            engines[name + suffix] = LLM(path, num_threads=1)
            instrument(engines[name + suffix], totals)
    os.environ.pop(DECODE_INPUT_BUFFERS_ENV)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(100, 110))}
    tokens = {name: llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids  # warm-up
              for name, llm in engines.items()}
    us: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
    for r in range(args.rounds):
        for name, llm in engines.items():
            totals.clear()
            start = time.thread_time()
            out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
            totals["total"] = time.thread_time() - start
            if out != tokens[name]:
                raise SystemExit(f"{name}: round {r + 1} generated other tokens than the warm-up")
            totals["host"] = totals["total"] - totals["chain"] - totals["head"] - totals["prompt"]
            for key, value in totals.items():
                us[name].setdefault(key, []).append(value * 1e6 / len(out))
        print(f"round {r + 1}: " + ", ".join(f"{n} host {v['host'][-1]:.0f} us" for n, v in us.items()), flush=True)
    median = {name: {key: statistics.median(values) for key, values in parts.items()} for name, parts in us.items()}
    for name, parts in median.items():
        print(f"{name}: " + ", ".join(f"{key} {value:.0f}" for key, value in parts.items()) + " us per output token")
    if args.out:
        result = {"threads": 1, "rounds": args.rounds, "max_tokens": args.max_tokens,
                  "load_average": list(os.getloadavg()), "us_per_token": us, "median_us_per_token": median}
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
