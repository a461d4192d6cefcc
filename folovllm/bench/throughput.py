"""``folovllm bench throughput``: offline throughput of the engine on a synthetic workload, with HF baselines.

The CLI couples to this module only through ``add_throughput_args`` and ``run_throughput``.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import time
from pathlib import Path
from typing import Any

import torch

from folovllm.bench.hf_baseline import run_hf_baselines
from folovllm.bench.ladder import run_ladder, write_ladder
from folovllm.bench.prefix import PREFIX_WORKLOADS, run_prefix_workload
from folovllm.bench.results import (
    CpuShare,
    RequestTiming,
    build_result,
    format_ratio_table,
    format_result,
    kv_cache_summary,
    prefill_tok_s,
    read_peak_rss_mb,
    reset_peak_rss,
    write_results,
)
from folovllm.bench.workloads import WORKLOADS, BenchRequest, build_workload_for_tokenizer
from folovllm.config import usable_cores
from folovllm.engine.args import add_engine_args, engine_config_from_args
from folovllm.sampling_params import SamplingParams

NUM_WARMUP_REQUESTS = 4
WARMUP_MAX_TOKENS = 4


def add_throughput_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench throughput`` options to ``parser`` and return it."""
    parser.add_argument("--workload", choices=sorted(WORKLOADS) + list(PREFIX_WORKLOADS), default="decode-heavy",
                        help="decode-heavy: 64×10→128; prefill-heavy: 16×512→16; variable: 64×10→U[16,256].")
    parser.add_argument("--num-requests", type=int, default=None, help="Override the workload's request count.")
    parser.add_argument("--input-len", type=int, default=None, help="Override the prompt length in tokens.")
    parser.add_argument("--output-len", type=int, default=None,
                        help="Override max_tokens (for 'variable': the upper end of its range).")
    parser.add_argument("--baseline", choices=["none", "hf"], default="none",
                        help="'hf': also run transformers generate (static batch and sequential) in this process.")
    parser.add_argument("--hf-sequential-requests", type=int, default=8,
                        help="Run hf-sequential on the first K requests only (it is slow); 0 skips it.")
    parser.add_argument("--compare", choices=["all"], default=None,
                        help="all: run the technique ladder M1 -> M2 -> M3 -> M5 -> M6 on the workload")
    parser.add_argument("--request-rate", type=float, default=1.0,
                        help="shared-prefix: requests per second (evenly spaced arrivals).")
    parser.add_argument("--output-json", default=None, help="Write the list of result objects here.")
    add_engine_args(parser)  # --model, --dtype, --seed (workload and engine), --num-threads, ...
    return parser


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def measure_engine(llm: Any, requests: list[BenchRequest]) -> tuple[list[RequestTiming], float]:
    """Warm up, then time one ``llm.generate`` over all requests, all arriving at its start (burst).

    Greedy with ignore_eos, so each request must produce exactly its max_tokens.
    """
    warmup = [{"prompt_token_ids": list(r.prompt_token_ids[:16])} for r in requests[:NUM_WARMUP_REQUESTS]]
    llm.generate(warmup, SamplingParams(temperature=0.0, max_tokens=WARMUP_MAX_TOKENS, ignore_eos=True), use_tqdm=False)

    prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in requests]
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    duration = time.perf_counter() - t0

    timings = []
    for req, out in zip(requests, outputs, strict=True):
        num_out = len(out.outputs[0].token_ids)
        if num_out != req.max_tokens:
            raise RuntimeError(f"A request produced {num_out} tokens with ignore_eos, expected {req.max_tokens}.")
        timings.append(RequestTiming(
            num_prompt_tokens=len(out.prompt_token_ids), num_output_tokens=num_out, arrival_time=t0,
            first_token_time=out.metrics.first_token_time, finished_time=out.metrics.finished_time,
        ))
    return timings, duration


def _model_vocab_size(llm: Any) -> int | None:
    engine = getattr(llm, "llm_engine", None)  # tests pass a stand-in without an engine
    return engine.model.arch.vocab_size if engine is not None else None


def ratio_metrics(workload: str) -> list[str]:
    """What to compare: output rate always; prefill rates where the workload is prompt-bound."""
    return ["output_tok_s", "input_tok_s", "prefill_tok_s"] if workload == "prefill-heavy" else ["output_tok_s"]


def run_throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the benchmark described by ``args`` (see ``add_throughput_args``); print and return the results."""
    from folovllm import LLM  # the engine is heavy; keep `--help` and the baselines free of it

    if args.workload in PREFIX_WORKLOADS:
        return run_prefix_workload(args)

    config = engine_config_from_args(args)
    threads = config.num_threads or usable_cores()
    if threads < 1:
        raise ValueError(f"--num-threads must be at least 1, got {threads}.")
    config = dataclasses.replace(config, num_threads=threads)
    torch.set_num_threads(threads)
    engine_config = {k: v for k, v in vars(config).items() if v is not None}
    dtype = str(config.torch_dtype).removeprefix("torch.")
    reset_peak_rss()
    llm = LLM(**vars(config))
    load_peak = read_peak_rss_mb()
    requests = build_workload_for_tokenizer(
        llm.tokenizer, args.workload, _model_vocab_size(llm), num_requests=args.num_requests, input_len=args.input_len,
        output_len=args.output_len, seed=args.seed,
    )
    workload_config = {
        "workload": args.workload, "num_requests": len(requests),
        "input_len": len(requests[0].prompt_token_ids), "max_tokens": max(r.max_tokens for r in requests),
        "seed": args.seed,
    }
    model_path = str(llm.model_path)
    if args.compare == "all":
        del llm
        gc.collect()
        rows = run_ladder(vars(config), requests, measure_engine)
        write_ladder(rows, args.output_json)
        return rows

    reset_peak_rss()
    share = CpuShare(torch.get_num_threads())
    timings, duration = measure_engine(llm, requests)
    cpu_share = share.stop()
    run_peak = read_peak_rss_mb()
    ours = build_result(
        name=args.workload, engine="folovllm", model=Path(model_path).name, dtype=dtype,
        device=default_device(), config={**workload_config, **engine_config}, timings=timings,
        duration_s=duration, peak_memory_mb=max(load_peak, run_peak),
        kv_cache=kv_cache_summary(llm.get_kv_cache_stats()),
        extra={"prefill_tok_s": prefill_tok_s(timings), "run_peak_rss_mb": run_peak, "cpu_share": cpu_share},
    )
    results = [ours]
    print(format_result(ours), flush=True)
    del llm  # free its weights and KV cache before the baselines load theirs
    gc.collect()

    if args.baseline == "hf":
        torch.set_num_threads(threads)
        baselines = run_hf_baselines(
            model_path, requests, name=args.workload, dtype=dtype, device=default_device(),
            sequential_requests=args.hf_sequential_requests, config=workload_config,
        )
        for base in baselines:
            print(format_result(base))
        print(format_ratio_table(ours, baselines, ratio_metrics(args.workload)))
        results += baselines

    if args.output_json:
        write_results(results, args.output_json)
    return results
