"""``folovllm bench spec``: speculative decoding on and off, alternating rounds, medians.

    folovllm bench spec --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    folovllm bench spec --speculative-config '{"model": DRAFT, "num_speculative_tokens": 3}' --workloads grounded

``grounded``: one stream (one request at a time), greedy, prompts that ask the model to repeat, quote or
edit a given text (this package's own module docstrings, so the texts need no download); ``decode-batch``:
64 random prompts decoded together (what speculation costs a full batch). Each round runs both engines
on the same prompts, alternating which goes first; the result holds each side's median output tok/s,
their ratio, whether the texts are identical and the spec engine's acceptance rate.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from folovllm.engine.args import add_engine_args, add_model_positional, engine_config_from_args

INSTRUCTIONS = ("Repeat the following text word for word.",
                "Quote the following text exactly, then stop.",
                "Copy the following text, changing only 'the' to 'a'.")
WORKLOADS = ("grounded", "decode-batch")


def grounded_conversations(count: int, max_chars: int = 700) -> list[list[dict]]:
    """``count`` chat prompts, each an instruction over one module docstring of this package."""
    root = Path(__file__).resolve().parent.parent
    texts = []
    for path in sorted(root.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if doc and len(doc) > 300:
            texts.append(doc[:max_chars])
    if len(texts) < count:
        raise SystemExit(f"only {len(texts)} module docstrings are long enough; ask for fewer prompts")
    picked = random.Random(0).sample(texts, count)
    return [[{"role": "user", "content": f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]}\n\n{text}"}]
            for i, text in enumerate(picked)]


def add_bench_spec_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=24, help="grounded: prompts per round (>= 20)")
    parser.add_argument("--output-len", type=int, default=128, help="grounded: most tokens per answer")
    parser.add_argument("--batch", type=int, default=64, help="decode-batch: requests decoded together")
    parser.add_argument("--out", help="write the results here (JSON)")
    add_model_positional(parser)
    add_engine_args(parser)


def _spec_counts(llm: Any) -> tuple[int, int, int]:
    stats = llm.llm_engine.stats
    return stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens


def _grounded(llm: Any, conversations: list[list[dict]], output_len: int) -> tuple[float, int, list[str]]:
    from folovllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len)
    seconds, tokens, texts = 0.0, 0, []
    for conversation in conversations:  # one stream: each request alone
        start = time.perf_counter()
        out = llm.chat(conversation, params, use_tqdm=False)[0].outputs[0]
        seconds += time.perf_counter() - start
        tokens += len(out.token_ids)
        texts.append(out.text)
    return seconds, tokens, texts


def _decode_batch(llm: Any, batch: int, rng: random.Random) -> tuple[float, int, list[str]]:
    from folovllm import SamplingParams

    prompts = [{"prompt_token_ids": [rng.randrange(1000, 20000) for _ in range(16)]} for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, sum(len(o.outputs[0].token_ids) for o in outputs), [o.outputs[0].text for o in outputs]


def run_bench_spec(args: argparse.Namespace) -> dict[str, Any]:
    from folovllm import LLM

    config = engine_config_from_args(args)
    if config.speculative_config is None:
        raise SystemExit("bench spec compares an engine with --speculative-config against one without; pass it")
    if args.num_prompts < 20:
        raise SystemExit(f"--num-prompts must be >= 20 (an input-grounded set), got {args.num_prompts}")
    names = args.workloads.split(",")
    if set(names) - set(WORKLOADS):
        raise SystemExit(f"unknown workloads {sorted(set(names) - set(WORKLOADS))}; choose from {WORKLOADS}")
    engines = {True: LLM(**vars(config)), False: LLM(**{**vars(config), "speculative_config": None})}
    platform = engines[True].llm_engine.platform_info
    print(f"speculative_config: {json.dumps(config.speculative_config)}; platform: {platform}")
    conversations = grounded_conversations(args.num_prompts)
    for llm in engines.values():  # warm-up
        _grounded(llm, conversations[:1], 8)
    samples = {n: {True: [], False: []} for n in names}
    texts: dict[str, dict[bool, list[str]]] = {n: {} for n in names}
    counts = {n: [0, 0, 0] for n in names}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        seed = r
        for name in names:
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                before = _spec_counts(engines[on])
                if name == "grounded":
                    seconds, tokens, texts[name][on] = _grounded(engines[on], conversations, args.output_len)
                else:
                    seconds, tokens, texts[name][on] = _decode_batch(engines[on], args.batch, random.Random(seed))
                samples[name][on].append(tokens / seconds)
                print(f"round {r} {name} spec {'on' if on else 'off'}: {tokens / seconds:.2f} output tok/s", flush=True)
                if on:
                    counts[name] = [c + a - b for c, a, b in zip(counts[name], _spec_counts(engines[on]), before)]
    results: dict[str, Any] = {"speculative_config": config.speculative_config, "rounds": args.rounds,
                               "platform": platform, "load_before": load_before, "load_after": os.getloadavg(),
                               "workloads": {}}
    for name in names:
        on, off = (statistics.median(samples[name][side]) for side in (True, False))
        drafts, proposed, accepted = counts[name]
        same = texts[name][True] == texts[name][False]
        rate = accepted / proposed if proposed else 0.0
        results["workloads"][name] = {
            "output_tok_s_on": on, "output_tok_s_off": off, "on_over_off": on / off, "same_text": same,
            "samples_on": samples[name][True], "samples_off": samples[name][False], "drafts": drafts,
            "draft_tokens": proposed, "accepted_tokens": accepted, "acceptance_rate": rate,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0}
        print(f"{name:13s} output tok/s on {on:8.2f}  off {off:8.2f}  on/off {on / off:5.3f}  same text: {same}  "
              f"acceptance {100 * rate:.1f}% of {proposed} proposed")
    print(f"load average before {load_before[0]:.1f}, after {results['load_after'][0]:.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return results

