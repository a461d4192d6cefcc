"""``folovllm bench profile``: where an engine's steps spend their time, under torch.profiler.

    folovllm bench profile --batch 1 --steps 64              # one stream's decode steps
    folovllm bench profile --batch 64 --prompt-len 16        # a decode batch
    folovllm bench profile --batch 4 --prompt-len 512 --steps 4 --dtype float32   # prefill steps
    folovllm bench profile --runner pooling --batch 64 --prompt-len 128 --prefill --steps 4   # embedding steps

Requests of ``--prompt-len`` random tokens are added and stepped until their prompts are done; then
``--steps`` engine steps run under the profiler. Reported: the step time (median), the ops that took the
most time (self CPU time per step, calls per step), and the step time no op accounts for: the engine's and
the model's Python, the host work around the kernels. On CUDA also the kernels with the most device time
per step, and their sum against the step time. On the CPU also the weights a step reads (every linear's,
the LM head's) over the step time, as GB/s and as a share of the host's memory bandwidth (a STREAM-style
triad, bench/bandwidth.py): how near a decode step runs to the memory's limit. A shared host's bandwidth
moves from one minute to the next, so after the profiled decode steps ``--bandwidth-rounds`` rounds each
measure the triad and then time ``--round-steps`` steps; the share is the median of the rounds' own
(``weights_read.rounds``), each step set against the triad of its moment.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from folovllm.bench.bandwidth import ARRAY_MIB, describe, memory_bandwidth
from folovllm.bench.results import bench_command
from folovllm.bench.switch_ab import prompt_id_range
from folovllm.engine.args import add_engine_args, add_model_positional, engine_config_from_args
from folovllm.model.layers.linear import LinearBase
from folovllm.model.quantization.gguf_native import GGUFPackedLinearMethod


def add_profile_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=1, help="requests stepped together")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--steps", type=int, default=32, help="engine steps profiled (decode steps, after the prompts)")
    parser.add_argument("--prefill", action="store_true",
                        help="profile the prompts' steps instead of decodes (always, for a pooling engine)")
    parser.add_argument("--top", type=int, default=15, help="ops listed")
    parser.add_argument("--bandwidth-mib", type=int, default=ARRAY_MIB,
                        help="MiB per array of the memory bandwidth measurement (far past the caches)")
    parser.add_argument("--bandwidth-rounds", type=int, default=3,
                        help="rounds of a triad and then --round-steps timed decode steps (CPU, decode steps)")
    parser.add_argument("--round-steps", type=int, default=8, help="decode steps timed in each bandwidth round")
    parser.add_argument("--out", help="write the results here (JSON)")
    add_model_positional(parser)
    add_engine_args(parser)


def run_bench_profile(args: argparse.Namespace) -> dict[str, Any]:
    from folovllm import LLM, PoolingParams, SamplingParams  # the engine, only once a run is asked for

    llm = LLM(**vars(engine_config_from_args(args)))
    engine = llm.llm_engine
    rng = random.Random(0)
    low, high = prompt_id_range(engine.vocab_size)
    pooling = engine.pooler_config is not None  # its requests end with their prompts: those steps are profiled
    prefill = args.prefill or pooling
    if args.bandwidth_rounds < 0 or args.round_steps < 1:
        raise ValueError("--bandwidth-rounds must be at least 0 and --round-steps at least 1")
    rounds = args.bandwidth_rounds if engine.device.type == "cpu" and not prefill else 0
    params = PoolingParams() if pooling else SamplingParams(
        temperature=0, max_tokens=args.steps + rounds * args.round_steps + 8, ignore_eos=True)
    engine.add_request({"prompt_token_ids": [rng.randrange(low, high) for _ in range(8)]},
                       PoolingParams() if pooling else SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                       request_id="warm-up")
    while engine.has_unfinished_requests():
        engine.step()
    for i in range(args.batch):
        engine.add_request({"prompt_token_ids": [rng.randrange(low, high) for _ in range(args.prompt_len)]},
                           params, request_id=str(i))
    scheduler = engine.scheduler
    while not prefill and any(r.num_computed_tokens < r.num_prompt_tokens
                                   for r in scheduler.running + scheduler.waiting):
        engine.step()
    results = {"command": bench_command("profile"), "batch": args.batch, "prompt_len": args.prompt_len,
               "prefill": prefill, **profile_steps(engine, args.steps, args.top), "platform": engine.platform_info}
    print(f"platform: {engine.platform_info}")
    print(f"{results['steps']} steps of {args.batch} requests ({'prefill' if prefill else 'decode'}): "
          f"{results['step_us_median']:.0f} us per step (median)")
    model = getattr(engine.worker, "model", None)
    if engine.device.type == "cpu" and model is not None:
        bandwidth = memory_bandwidth(engine.config.num_threads, args.bandwidth_mib)
        read = step_weight_bytes(model)
        gb_s = read / results["step_us_median"] / 1e3
        results["weights_read"] = {"bytes_per_step": read, "gb_s": gb_s, "memory_bandwidth": bandwidth,
                                   "triad_share": gb_s / bandwidth["triad_gb_s"]}
        print(f"weights read per step: {read / 2**20:.1f} MiB, {gb_s:.1f} GB/s at the median step "
              f"({gb_s / bandwidth['triad_gb_s']:.0%} of triad); {describe(bandwidth)}")
        if rounds:
            by_round = bandwidth_rounds(engine, read, rounds, args.round_steps, args.bandwidth_mib)
            results["weights_read"].update(by_round)
            print(f"  in {rounds} rounds of a triad and {args.round_steps} steps: "
                  + ", ".join(f"{r['gb_s']:.1f} of {r['triad_gb_s']:.1f} GB/s" for r in by_round["rounds"])
                  + f"; median share {by_round['round_share_median']:.0%} of the triad")
    for row in results["ops"]:
        print(f"  {row['op']:45s} {row['us_per_step']:9.1f} us  {row['calls_per_step']:6.1f} calls")
    print(f"  {'(no op: Python, the engine, the host)':45s} {results['host_us_per_step']:9.1f} us")
    if "kernels" in results:
        print(f"device kernels: {results['device_us_per_step']:.0f} us per step in all")
        for row in results["kernels"]:
            print(f"  {row['kernel'][:60]:60s} {row['us_per_step']:9.1f} us  {row['calls_per_step']:6.1f} calls")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return results


def bandwidth_rounds(engine: Any, read: int, rounds: int, steps: int, mib: int) -> dict[str, Any]:
    """``rounds`` rounds of the host's triad, then ``steps`` timed engine steps: per round its triad, median
    step, the ``read`` bytes a step reads over that step time and their share of the triad; and the
    rounds' median share."""
    found = []
    with torch.inference_mode():
        for _ in range(rounds):
            bandwidth = memory_bandwidth(engine.config.num_threads, mib, tries=3)
            step_s = []
            for _ in range(steps):
                if not engine.has_unfinished_requests():
                    raise ValueError("the requests ended before the bandwidth rounds did")
                start = time.perf_counter()
                engine.step()
                step_s.append(time.perf_counter() - start)
            step_us = statistics.median(step_s) * 1e6
            gb_s = read / step_us / 1e3
            found.append({"triad_gb_s": bandwidth["triad_gb_s"], "read_gb_s": bandwidth["read_gb_s"],
                          "step_us_median": step_us, "gb_s": gb_s, "triad_share": gb_s / bandwidth["triad_gb_s"]})
    return {"rounds": found, "round_share_median": statistics.median(r["triad_share"] for r in found)}


def step_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights a decode step reads: every linear's, the LM head's included (a table the head shares
    with the embedding counted there, once); not the embedding's own table, of which a step reads a few rows."""
    tensors = {}
    for module in model.modules():
        if isinstance(module, LinearBase):
            # a tied head's embedding is its child: its table counts only as the head's own weight (a packed
            # head reads its copy, not the embedding's)
            named = [*module.named_parameters(), *module.named_buffers()]
            tensors.update({id(t): t for name, t in named if not name.startswith("tied.")})
            if isinstance(module.method, GGUFPackedLinearMethod):
                table = module.method.table(module)
                tensors.update({id(t): t for t in (*table.parameters(), *table.buffers())})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def profile_steps(engine: Any, steps: int, top: int = 15) -> dict[str, Any]:
    """Runs up to ``steps`` engine steps under torch.profiler: the median step time, the ops with the most
    self CPU time per step and the time no op accounts for; on CUDA also the kernels with the most device
    time per step and their sum (each step is timed from a synchronized device to a synchronized device)."""
    cuda = engine.device.type == "cuda"
    step_s: list[float] = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.inference_mode(), profile(activities=activities) as prof:
        for _ in range(steps):
            if not engine.has_unfinished_requests():
                break
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            engine.step()
            if cuda:
                torch.cuda.synchronize()
            step_s.append(time.perf_counter() - start)
    num = len(step_s)
    if num == 0:
        raise ValueError("no engine step ran: the engine had no unfinished requests")
    events = prof.key_averages()
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    in_ops_us = sum(e.self_cpu_time_total for e in ops) / num
    out: dict[str, Any] = {
        "steps": num, "step_us_median": statistics.median(step_s) * 1e6,
        "host_us_per_step": max(0.0, sum(step_s) * 1e6 / num - in_ops_us),
        "ops": [{"op": e.key, "us_per_step": e.self_cpu_time_total / num, "calls_per_step": e.count / num}
                for e in ops[:top]]}
    if cuda:
        # kernel rows only: a CPU op's row repeats the device time of the kernels it launched
        kernels = sorted((e for e in events if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0),
                         key=lambda e: e.self_device_time_total, reverse=True)
        out["device_us_per_step"] = sum(e.self_device_time_total for e in kernels) / num
        out["kernels"] = [{"kernel": e.key, "us_per_step": e.self_device_time_total / num,
                           "calls_per_step": e.count / num} for e in kernels[:top]]
    return out
