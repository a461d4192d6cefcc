"""``folovllm bench embed``: offline embedding throughput of a pooling engine beside transformers' batched forward.

The same random token-id inputs (``--num-inputs`` × ``--input-len``, seeded) go through ``LLM.embed``
(``runner="pooling"``) and through the transformers model's base forward in batches of
``--hf-batch-size``, both pooled the same way (``--pooling-type``) and normalized. Each side is warmed
up first; the result JSON holds both runs (inputs/s and tokens/s), their ratio and the smallest cosine
between the two sides' vectors (a check that they embedded the same thing). With ``--rounds N`` both
sides stay loaded and take turns, ours then transformers', N times; each side's figure is its median
round, and every round's seconds are kept in the JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from folovllm.bench.hf_baseline import load_hf_model
from folovllm.bench.results import (
    RequestTiming,
    build_result,
    format_ratio_table,
    format_result,
    read_peak_rss_mb,
    reset_peak_rss,
    write_results,
)
from folovllm.bench.throughput import default_device
from folovllm.config import usable_cores
from folovllm.engine.args import add_engine_args, engine_config_from_args
from folovllm.pooling_params import PoolingParams

NUM_WARMUP_INPUTS = 4


def add_embed_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench embed`` options to ``parser`` and return it."""
    parser.add_argument("--num-inputs", type=int, default=256, help="inputs embedded in the timed run")
    parser.add_argument("--input-len", type=int, default=128, help="tokens per input")
    parser.add_argument("--pooling-type", choices=["LAST", "MEAN"], default="LAST",
                        help="how both sides pool the final normed hidden states (then normalize)")
    parser.add_argument("--baseline", choices=["none", "hf"], default="hf",
                        help="'hf': also run transformers' batched forward on the same inputs in this process")
    parser.add_argument("--hf-batch-size", type=int, default=64, help="inputs per transformers forward")
    parser.add_argument("--output-json", default=None, help="write the list of result objects here")
    parser.add_argument("--rounds", type=int, default=1,
                        help="timed runs per side, taking turns (each side's figure: its median round)")
    add_engine_args(parser)
    return parser


def random_inputs(num_inputs: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    if num_inputs < 1 or input_len < 1:
        raise ValueError(f"--num-inputs and --input-len must be at least 1; got {num_inputs} and {input_len}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (num_inputs, input_len), generator=gen).tolist()


def hf_embed(model: Any, inputs: list[list[int]], batch_size: int, pooling_type: str) -> torch.Tensor:
    """transformers' base forward in batches (equal lengths: no padding), pooled and normalized."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(inputs), batch_size):
            hidden = model.model(torch.tensor(inputs[start:start + batch_size])).last_hidden_state.float()
            out.append(hidden[:, -1] if pooling_type == "LAST" else hidden.mean(dim=1))
    return F.normalize(torch.cat(out), dim=-1)


def _result(engine: str, model: str, dtype: str, config: dict, inputs: list[list[int]], t0: float,
            duration: float, peak: float, extra: dict) -> dict[str, Any]:
    timings = [RequestTiming(len(ids), 0, t0, t0 + duration) for ids in inputs]
    result = build_result(name="embed", engine=engine, model=model, dtype=dtype, device=default_device(),
                          config=config, timings=timings, duration_s=duration, peak_memory_mb=peak, extra=extra)
    result["inputs_per_s"] = len(inputs) / duration
    return result


def run_bench_embed(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run ``bench embed`` as ``args`` say; print and return the results."""
    from folovllm import LLM  # the engine is heavy; keep `--help` free of it

    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1; got {args.rounds}")
    config = engine_config_from_args(args)
    threads = config.num_threads or usable_cores()
    config = dataclasses.replace(config, num_threads=threads, runner="pooling",
                                 pooler_config={"pooling_type": args.pooling_type, "normalize": True})
    torch.set_num_threads(threads)
    dtype = str(config.torch_dtype).removeprefix("torch.")
    reset_peak_rss()
    llm = LLM(**vars(config))
    inputs = random_inputs(args.num_inputs, args.input_len, llm.llm_engine.vocab_size, args.seed)
    bench_config = {"num_inputs": args.num_inputs, "input_len": args.input_len, "pooling_type": args.pooling_type,
                    "seed": args.seed, "num_threads": threads,
                    "max_num_batched_tokens": config.max_num_batched_tokens}
    prompts = [{"prompt_token_ids": ids} for ids in inputs]

    def embed_ours() -> tuple[torch.Tensor, float, float, int]:
        """(vectors, start, seconds, tokens read from the prefix cache) of one timed run over every input."""
        llm.reset_prefix_cache()  # every timed run computes every input (no blocks from the warm-up or a last round)
        hits = llm.llm_engine.kv_cache.prefix_cache_hits
        t0 = time.perf_counter()
        vectors = torch.tensor([o.outputs.embedding for o in llm.embed(prompts, PoolingParams(), use_tqdm=False)])
        return vectors, t0, time.perf_counter() - t0, llm.llm_engine.kv_cache.prefix_cache_hits - hits

    llm.embed(prompts[:NUM_WARMUP_INPUTS], use_tqdm=False)
    ours_runs = [embed_ours()]
    ours_peak = read_peak_rss_mb()  # before transformers' model is loaded beside it
    model_path = str(llm.model_path)
    model = None
    if args.baseline == "hf":
        if args.rounds == 1:  # one run each: the engine goes first, so each side's peak memory is its own
            del llm
            gc.collect()
        model = load_hf_model(model_path, dtype)
        hf_embed(model, inputs[:NUM_WARMUP_INPUTS], args.hf_batch_size, args.pooling_type)
    hf_rounds = []
    for r in range(args.rounds):
        if r > 0:
            ours_runs.append(embed_ours())
        if model is not None:
            hf_t0 = time.perf_counter()
            theirs_vectors = hf_embed(model, inputs, args.hf_batch_size, args.pooling_type)
            hf_rounds.append(time.perf_counter() - hf_t0)
    ours_vectors, t0 = ours_runs[-1][:2]
    ours_rounds = [run[2] for run in ours_runs]
    ours = _result("folovllm", Path(model_path).name, dtype, {**bench_config, "rounds": args.rounds}, inputs, t0,
                   statistics.median(ours_rounds), ours_peak,
                   {"round_seconds": ours_rounds, "prefix_cache_hit_tokens": sum(run[3] for run in ours_runs)})
    print(format_result(ours), flush=True)
    results = [ours]
    if model is not None:
        cosine = F.cosine_similarity(ours_vectors, theirs_vectors, dim=-1).min().item()
        theirs = _result("hf-batched-forward", Path(model_path).name, dtype,
                         {**bench_config, "rounds": args.rounds, "hf_batch_size": args.hf_batch_size}, inputs,
                         hf_t0, statistics.median(hf_rounds), read_peak_rss_mb(), {"round_seconds": hf_rounds})
        ours["extra"]["min_cosine_vs_hf"] = cosine
        print(format_result(theirs))
        print(format_ratio_table(ours, [theirs], ["inputs_per_s", "input_tok_s"]))
        print(f"smallest cosine between the two sides' embeddings: {cosine:.5f}")
        results.append(theirs)
    if args.output_json:
        write_results(results, args.output_json)
    return results
