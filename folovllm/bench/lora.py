"""`folovllm bench lora`: decode throughput with adapters against the base model alone.

Two engines of the same model, one with LoRA off (``base``: its fastest compiled form) and one with LoRA on,
run the same decode batch (``--rows`` requests, short prompts, ``--max-tokens`` new tokens each, greedy) several
ways per round, in an order that rotates every round: every row on the base model in each engine, then for each
rank in ``--ranks`` the rows spread over ``--adapters`` random adapters of that rank (every linear adapted), in
the LoRA engine. It reports each side's median output tok/s, their ratio to the base, the extra milliseconds
each costs per ``--rows`` output tokens (prefill included), start-up and adapter load time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from folovllm.bench.switch_ab import prompt_id_range, write_switch_results
from folovllm.engine.args import add_engine_args, add_model_positional, engine_config_from_args
from folovllm.lora.adapter import linear_pieces
from folovllm.lora.request import LoRARequest
from folovllm.model.arch import ArchConfig

# checkpoint module -> (our linear, its piece): the shapes an adapter's tensors take
_MODULES = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2), "o_proj": ("o_proj", 0),
            "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1), "down_proj": ("down_proj", 0)}


def add_lora_bench_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=64, help="requests decoded together")
    parser.add_argument("--adapters", type=int, default=8, help="adapters per rank, spread over the rows")
    parser.add_argument("--ranks", default="8,64", help="comma-separated adapter ranks, each timed on its own")
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per request (decode steps)")
    parser.add_argument("--out", help="write the results here (JSON)")
    add_model_positional(parser)
    add_engine_args(parser)


def write_random_adapter(folder: Path, arch: ArchConfig, rank: int, seed: int) -> Path:
    """A PEFT adapter of ``rank`` on every decoder linear, random (small, so outputs stay sane)."""
    gen = torch.Generator().manual_seed(seed)
    pieces = linear_pieces(arch)
    tensors = {}
    for layer in range(arch.num_hidden_layers):
        for module, (linear, piece) in _MODULES.items():
            in_features, outs = pieces[linear]
            part = "self_attn" if linear in ("qkv_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=gen) / in_features ** 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(outs[piece], rank, generator=gen) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(_MODULES)}))
    return folder


def run_bench_lora(args: argparse.Namespace) -> dict[str, Any]:
    from folovllm import LLM, SamplingParams  # the engine, only once a run is asked for

    ranks = [int(r) for r in args.ranks.split(",")]
    config = dataclasses.replace(engine_config_from_args(args), num_threads=args.threads, enable_lora=True,
                                 max_loras=args.adapters, max_lora_rank=max(ranks),
                                 max_cpu_loras=args.adapters * len(ranks), max_num_seqs=max(args.rows, 1))
    base_llm = LLM(**vars(dataclasses.replace(config, enable_lora=False)))
    start = time.perf_counter()
    llm = LLM(**vars(config))
    startup_s = time.perf_counter() - start
    engine = llm.llm_engine
    sides: dict[str, tuple[Any, list[LoRARequest | None]]] = {
        "base": (base_llm, [None] * args.rows), "lora-on": (llm, [None] * args.rows)}
    load_s: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rank in ranks:
            adapters = []
            for i in range(args.adapters):
                lora_id = len(load_s) * args.adapters + i + 1
                folder = write_random_adapter(Path(tmp) / f"r{rank}-{i}", engine.model.arch, rank, lora_id)
                adapters.append(LoRARequest(f"r{rank}-{i}", lora_id, str(folder)))
                engine.add_lora(adapters[-1])
            load_s[f"r{rank}"] = [engine.worker.lora.load_seconds[a.lora_int_id] for a in adapters]
            sides[f"r{rank}"] = (llm, [adapters[row % args.adapters] for row in range(args.rows)])
        samples = _alternate(SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True),
                             sides, args)
    medians = {side: statistics.median(values) for side, values in samples.items()}
    base = medians["base"]
    step_ms = {side: 1000 * args.rows / tok_s for side, tok_s in medians.items()}  # ms per token of every row
    results: dict[str, Any] = {
        "rows": args.rows, "adapters": args.adapters, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
        "threads": args.threads, "rounds": args.rounds, "startup_s": startup_s,
        "output_tok_s": medians, "samples": samples, "platform": engine.platform_info,
        "ratio_to_base": {side: tok_s / base for side, tok_s in medians.items() if side != "base"},
        "extra_ms_per_step": {side: ms - step_ms["base"] for side, ms in step_ms.items() if side != "base"},
        "adapter_load_s": {side: statistics.median(values) for side, values in load_s.items()}}
    print(f"platform: {engine.platform_info}; start-up {startup_s:.1f} s")
    for side, tok_s in medians.items():
        extra = "" if side == "base" else (f"  x{results['ratio_to_base'][side]:.3f} of base, "
                                           f"+{results['extra_ms_per_step'][side]:.1f} ms per {args.rows} tokens")
        if side in results["adapter_load_s"]:
            extra += f", load {1000 * results['adapter_load_s'][side]:.1f} ms/adapter"
        print(f"{side:6s} {tok_s:8.1f} output tok/s{extra}")
    write_switch_results(results, args.out)
    return results


def _alternate(params: Any, sides: dict[str, tuple[Any, list[LoRARequest | None]]],
               args: argparse.Namespace) -> dict[str, list[float]]:
    """Output tok/s of each side (its engine, each row's adapter) per round; the order rotates so no side
    always runs first."""
    rng = random.Random(0)
    low, high = prompt_id_range(sides["base"][0].llm_engine.vocab_size)
    names = list(sides)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for llm, loras in sides.values():  # warm-up: every adapter in a slot, every code path run once
        llm.generate([{"prompt_token_ids": [low] * args.prompt_len}] * args.rows,
                     dataclasses.replace(params, max_tokens=2), lora_request=loras, use_tqdm=False)
    for r in range(args.rounds):
        prompts = [{"prompt_token_ids": [rng.randrange(low, high) for _ in range(args.prompt_len)]}
                   for _ in range(args.rows)]  # fresh each round: a cached prefix would time nothing
        for name in names[r % len(names):] + names[:r % len(names)]:
            llm, loras = sides[name]
            start = time.perf_counter()
            llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
            samples[name].append(args.rows * params.max_tokens / (time.perf_counter() - start))
            print(f"round {r}: {name:6s} {samples[name][-1]:8.1f} output tok/s", flush=True)
    return samples
