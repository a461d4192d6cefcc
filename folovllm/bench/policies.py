"""``folovllm bench policies``: scheduling policies and admission modes side by side, same run.

Scenarios (at CPU scale; timed arrivals into the offline engine):
- priority: overload (arrivals above capacity), 25 % high priority: high-class P99 TTFT, fcfs vs priority.
- sjf: mixed short/long prompts under overload: mean / P99 E2EL and worst queueing delay.
- fair: tenant A bursts at 10x tenant B's rate: the quiet tenant's TTFT, fcfs vs fair.
- admission: max_tokens far above what requests really generate (chat clients often ask for the maximum):
  on-demand vs reserve vs adaptive: throughput, concurrency, preemptions, KV usage.
"""
from __future__ import annotations

import argparse
import gc
from typing import Any

import numpy as np

from folovllm.bench.driver import TimedRequest, drive, poisson_arrivals, summarize
from folovllm.bench.results import write_results
from folovllm.sampling_params import SamplingParams

SCENARIOS = ("priority", "sjf", "fair", "admission")
TOPICS = ["a lighthouse", "a lost key", "the first snow", "a robot chef", "an old map", "a quiet library",
          "a river crossing", "a broken clock", "a desert city", "a friendly dragon", "a night train",
          "a garden on Mars", "a chess match", "a forgotten song", "a storm at sea", "a paper boat"]


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(t) for t in rng.integers(1000, 40000, size=n)]


def priority_workload(seed: int) -> list[TimedRequest]:
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(40, 6.0, seed)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    high = set(rng.choice(40, size=10, replace=False).tolist())
    return [TimedRequest(_ids(rng, 10), params, t, priority=0 if i in high else 1,
                         tag="high" if i in high else "low") for i, t in enumerate(arrivals)]


def mixed_workload(seed: int) -> list[TimedRequest]:
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(40, 3.0, seed)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    return [TimedRequest(_ids(rng, 512 if long else 10), params, t, tag="long" if long else "short")
            for t, long in zip(arrivals, rng.random(40) < 0.5)]


def two_tenant_workload(seed: int) -> list[TimedRequest]:
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    loud = [TimedRequest(_ids(rng, 10), params, t, user="loud", tag="loud")
            for t in poisson_arrivals(40, 8.0, seed)]
    quiet = [TimedRequest(_ids(rng, 10), params, t + 0.5, user="quiet", tag="quiet")
             for t in poisson_arrivals(4, 0.8, seed + 1)]
    return loud + quiet


def long_max_tokens_workload(tokenizer) -> list[TimedRequest]:
    """Real chat prompts that stop at EOS well below max_tokens (chat clients ask for far more than they use)."""
    params = SamplingParams(temperature=0, max_tokens=512)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Write a short story about {t}."}],
                                             tokenize=False, add_generation_prompt=True) for t in TOPICS[:8]]
    return [TimedRequest(tokenizer.encode(p, add_special_tokens=False), params, 0.0, tag="story")
            for p in prompts]


def _by_tag(records) -> dict[str, Any]:
    tags = sorted({r.tag for r in records})
    return {tag: summarize([r for r in records if r.tag == tag]) for tag in tags}


def _run(make_llm, requests: list[TimedRequest], label: str, **engine_args) -> dict[str, Any]:
    llm = make_llm(**engine_args)
    llm.generate([{"prompt_token_ids": [11, 12, 13]}], SamplingParams(max_tokens=2), use_tqdm=False)
    records, trace = drive(llm.llm_engine, requests)
    del llm
    gc.collect()
    summary = summarize(records)
    return {"name": label, "engine": "folovllm", "config": engine_args, **summary,
            "classes": _by_tag(records), "duration_s": trace.duration_s,
            "output_tok_s": summary["output_tokens"] / trace.duration_s,
            "peak_running": trace.peak_running, "mean_running": trace.mean_running,
            "peak_kv_usage": trace.peak_kv_usage, "preemptions": trace.preemptions}


def run_scenario(name: str, make_llm, tokenizer, seed: int) -> list[dict[str, Any]]:
    if name == "priority":
        reqs = priority_workload(seed)
        runs = [_run(make_llm, reqs, "priority", max_num_seqs=8, scheduling_policy=p) for p in ("fcfs", "priority")]
        for r in runs:
            c = r["classes"]
            print(f"  {r['config']['scheduling_policy']:>8}: high P99 TTFT {c['high']['ttft_ms']['p99']:8.0f} ms, "
                  f"low P99 TTFT {c['low']['ttft_ms']['p99']:8.0f} ms, preemptions {r['preemptions']}")
    elif name == "sjf":
        reqs = mixed_workload(seed)
        runs = [_run(make_llm, reqs, "sjf", max_num_seqs=8, scheduling_policy=p, max_queue_delay=d)
                for p, d in (("fcfs", None), ("sjf", None), ("sjf", 5.0))]
        for r in runs:
            cfg = r["config"]
            print(f"  {cfg['scheduling_policy']:>4} (max_queue_delay={cfg['max_queue_delay']}): E2EL mean "
                  f"{r['e2el_ms']['mean']:7.0f} ms P99 {r['e2el_ms']['p99']:7.0f} ms, worst queueing delay "
                  f"{r['queue_delay_ms']['max']:7.0f} ms")
    elif name == "fair":
        reqs = two_tenant_workload(seed)
        runs = [_run(make_llm, reqs, "fair", max_num_seqs=4, scheduling_policy=p) for p in ("fcfs", "fair")]
        for r in runs:
            q = r["classes"]["quiet"]["ttft_ms"]
            print(f"  {r['config']['scheduling_policy']:>4}: quiet tenant TTFT mean {q['mean']:7.0f} ms, max "
                  f"{q['max']:7.0f} ms; loud tenant TTFT mean {r['classes']['loud']['ttft_ms']['mean']:7.0f} ms")
    else:
        reqs = long_max_tokens_workload(tokenizer)
        runs = [_run(make_llm, reqs, "admission", admission=a, max_num_seqs=64, num_gpu_blocks_override=128,
                     max_model_len=1024) for a in ("on-demand", "reserve", "adaptive")]
        for r in runs:
            print(f"  {r['config']['admission']:>9}: {r['output_tok_s']:6.1f} output tok/s, peak running "
                  f"{r['peak_running']:3d} (mean {r['mean_running']:5.1f}), preemptions {r['preemptions']:3d}, "
                  f"peak KV usage {r['peak_kv_usage']:.0%}, E2EL mean {r['e2el_ms']['mean']:.0f} ms")
    return runs


def add_policies_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from folovllm.engine.args import add_engine_args

    parser.add_argument("--scenario", choices=SCENARIOS + ("all",), default="all")
    parser.add_argument("--output-json", default=None)
    add_engine_args(parser)
    return parser


def run_policies(args: argparse.Namespace) -> list[dict[str, Any]]:
    from folovllm import LLM
    from folovllm.engine.args import engine_config_from_args
    from folovllm.model.loader import default_model_path
    from folovllm.model.loader.tokenizer import load_tokenizer

    base = vars(engine_config_from_args(args))

    def make_llm(**overrides):
        return LLM(**{**base, **overrides})

    tokenizer = load_tokenizer(base["model"] or default_model_path())
    results = []
    for name in (SCENARIOS if args.scenario == "all" else (args.scenario,)):
        print(f"scenario {name}:", flush=True)
        results += run_scenario(name, make_llm, tokenizer, args.seed)
    if args.output_json:
        write_results(results, args.output_json)
    return results
