"""Greedy generations of a few prompts side by side: bf16, a GPTQ 4-bit folder, INT8 at load.

    .venv/bin/python scripts/quant_samples.py --gptq DIR --out docs/results/quant-samples.json

DIR is a folder written by ``folovllm quantize`` (GPTQ 4-bit g128 of the default model). Each variant
loads in its own engine, one after the other, and answers every prompt (chat template, greedy,
``--max-tokens`` tokens). The JSON holds, per variant, its settings and per prompt the text and how
many leading tokens agree with bf16.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm import LLM, SamplingParams  # noqa: E402

PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain in one sentence what a hash table is.",
    "List three primary colors.",
)


def generate(model: str | None, quantization: str | None, prompts: tuple[str, ...],
             max_tokens: int) -> list[tuple[str, list[int]]]:
    """(text, token ids) of each prompt's greedy answer from one engine."""
    args: dict[str, Any] = {"dtype": "bfloat16"} | ({"quantization": quantization} if quantization else {})
    llm = LLM(model, **args)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    result = [(o.outputs[0].text, list(o.outputs[0].token_ids)) for o in outputs]
    del llm
    gc.collect()
    return result


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gptq", required=True, help="a GPTQ folder written by folovllm quantize")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--out", default="docs/results/quant-samples.json")
    args = parser.parse_args()
    if args.max_tokens <= 0:
        raise ValueError(f"--max-tokens must be positive, got {args.max_tokens}")
    variants = {"bf16": (None, None), "gptq4": (args.gptq, None), "int8": (None, "int8")}
    answers = {name: generate(model, quant, PROMPTS, args.max_tokens) for name, (model, quant) in variants.items()}
    gptq_config = json.loads((Path(args.gptq) / "config.json").read_text())["quantization_config"]
    report = {
        "command": "python scripts/quant_samples.py " + " ".join(sys.argv[1:]),
        "max_tokens": args.max_tokens,
        "gptq_quantization_config": gptq_config,
        "prompts": [
            {"prompt": prompt, **{name: {"text": answers[name][i][0],
                                          "tokens_agreeing_with_bf16": agreeing_prefix(answers[name][i][1],
                                                                                       answers["bf16"][i][1])}
                                   for name in variants}}
            for i, prompt in enumerate(PROMPTS)
        ],
    }
    Path(args.out).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
