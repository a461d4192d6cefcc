"""One stream through the whole engine: bf16 against GPTQ 4-bit, milliseconds per output token.

    .venv/bin/python scripts/quant_one_stream.py --rounds 7 --out docs/results/quant-one-stream.json

``scripts/quant_bench.py`` times the model's steps alone; this times what a user sees: ``LLM.generate``
of one greedy request (10 prompt tokens, ``--max-tokens`` out, ``ignore_eos``) on the default model in
bfloat16 and on the same model written as a GPTQ checkpoint (round-to-nearest 4-bit codes, groups of
128, ``folovllm quantize --method rtn``), each with the engine's defaults for it (the int8 LM head for
the quantized one, our kernels, two threads unless ``--threads``). Both engines are loaded in this one
process and take turns, round by round; reported: each one's median ms per output token, the ratio of
the medians and the median of each round's own ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from folovllm import LLM, SamplingParams  # noqa: E402
from folovllm.model.loader import default_model_path  # noqa: E402
from quant_bench import write_gptq_folder  # noqa: E402


def ms_per_token(llm: LLM, prompt: dict, params: SamplingParams) -> float:
    start = time.perf_counter()
    out = llm.generate([prompt], params, use_tqdm=False)
    return (time.perf_counter() - start) * 1000 / len(out[0].outputs[0].token_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    gptq = write_gptq_folder(Path(tempfile.mkdtemp(prefix="quant-one-stream-")) / "gptq4", 4, 128)
    engines = {"bf16": LLM(default_model_path(), num_threads=args.threads),
               "gptq-4bit-g128": LLM(gptq, num_threads=args.threads)}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(100, 110))}
    for llm in engines.values():  # warm-up
        llm.generate([prompt], params, use_tqdm=False)
    ms: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        for name, llm in engines.items():
            ms[name].append(ms_per_token(llm, prompt, params))
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.2f} ms" for n, v in ms.items())
              + f", ratio {ms['bf16'][-1] / ms['gptq-4bit-g128'][-1]:.2f}", flush=True)
    median = {name: statistics.median(v) for name, v in ms.items()}
    round_ratios = [b / q for b, q in zip(ms["bf16"], ms["gptq-4bit-g128"])]
    result = {"threads": args.threads, "rounds": args.rounds, "max_tokens": args.max_tokens,
              "load_average": list(os.getloadavg()), "ms_per_token": ms, "median_ms_per_token": median,
              "ratio": median["bf16"] / median["gptq-4bit-g128"], "round_ratios": round_ratios,
              "median_round_ratio": statistics.median(round_ratios)}
    print(f"median ms per output token: bf16 {median['bf16']:.2f}, GPTQ 4-bit {median['gptq-4bit-g128']:.2f}; "
          f"4-bit {result['ratio']:.2f}x as fast (each round's own ratio, median: {result['median_round_ratio']:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
