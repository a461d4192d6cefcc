"""Prefix-caching benchmarks: ``--workload shared-prefix`` and ``--workload multi-turn``.

Each runs the same requests twice in one process, prefix caching on and off, and reports the
prefill tokens actually computed, the cache hit rate and TTFT.
"""
from __future__ import annotations

import argparse
import gc
from typing import Any

import numpy as np

from folovllm.bench.driver import TimedRequest, drive
from folovllm.bench.results import latency_stats, write_results
from folovllm.bench.workloads import special_token_ids
from folovllm.sampling_params import SamplingParams

PREFIX_WORKLOADS = ("shared-prefix", "multi-turn")


def _random_ids(rng: np.random.Generator, allowed: np.ndarray, n: int) -> list[int]:
    return [int(t) for t in rng.choice(allowed, size=n)]


def _allowed_ids(tokenizer, vocab_size: int) -> np.ndarray:
    """Token ids a synthetic prompt may use: in the model's vocabulary, not special."""
    specials = np.fromiter(special_token_ids(tokenizer), dtype=np.int64)
    return np.setdiff1d(np.arange(min(len(tokenizer), vocab_size)), specials)


def _measure(make_llm, prompts, params, arrivals) -> dict[str, Any]:
    llm = make_llm()
    engine = llm.llm_engine
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [11, 12, 13]}], warm, use_tqdm=False)
    engine.reset_prefix_cache()
    before = (engine.stats.prompt_tokens, engine.kv_cache.prefix_cache_queries,
              engine.kv_cache.prefix_cache_hits)
    records, trace = drive(engine, [TimedRequest(p, params, t) for p, t in zip(prompts, arrivals)])
    ttfts, duration = [r.ttft for r in records], trace.duration_s
    computed = engine.stats.prompt_tokens - before[0]
    queries = engine.kv_cache.prefix_cache_queries - before[1]
    hits = engine.kv_cache.prefix_cache_hits - before[2]
    del llm
    gc.collect()
    return {"prefill_tokens_computed": computed, "prompt_tokens": sum(len(p) for p in prompts),
            "prefix_cache_queries": queries, "prefix_cache_hits": hits,
            "hit_rate": hits / queries if queries else 0.0,
            "ttft_ms": latency_stats(ttfts), "duration_s": duration}


def shared_prefix_requests(allowed: np.ndarray, num_requests: int, prefix_len: int, question_len: int,
                           seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prefix = _random_ids(rng, allowed, prefix_len)
    return [prefix + _random_ids(rng, allowed, question_len) for _ in range(num_requests)]


def run_shared_prefix(args: argparse.Namespace, make_llm, allowed: np.ndarray) -> list[dict[str, Any]]:
    n = args.num_requests or 16
    prefix_len, question_len = args.input_len or 768, 32
    prompts = shared_prefix_requests(allowed, n, prefix_len, question_len, args.seed)
    params = SamplingParams(temperature=0, max_tokens=args.output_len or 16, ignore_eos=True)
    rate = args.request_rate
    arrivals = [i / rate for i in range(n)]
    results = []
    for caching in (True, False):
        row = _measure(lambda: make_llm(enable_prefix_caching=caching), prompts, params, arrivals)
        row.update(name="shared-prefix", engine="folovllm", prefix_caching=caching,
                   num_requests=n, prefix_len=prefix_len, question_len=question_len,
                   request_rate=rate, shared_fraction=prefix_len / (prefix_len + question_len))
        results.append(row)
    on, off = results
    print(f"shared-prefix: {n} requests = {prefix_len}-token common prefix + {question_len}-token question, "
          f"{rate} req/s")
    for row in results:
        print(f"  caching {'on ' if row['prefix_caching'] else 'off'}: prefill computed "
              f"{row['prefill_tokens_computed']:>6} / {row['prompt_tokens']} tokens, hit rate "
              f"{row['hit_rate']:.1%}, TTFT mean {row['ttft_ms']['mean']:.0f} ms p90 {row['ttft_ms']['p90']:.0f} ms")
    drop = 1 - on["prefill_tokens_computed"] / off["prefill_tokens_computed"]
    speedup = off["ttft_ms"]["mean"] / on["ttft_ms"]["mean"]
    print(f"  computed prefill tokens -{drop:.1%}; mean TTFT {speedup:.1f}x lower with caching")
    on["computed_prefill_drop"], on["ttft_speedup"] = drop, speedup
    return results


def run_multi_turn(args: argparse.Namespace, make_llm, allowed: np.ndarray) -> list[dict[str, Any]]:
    """Conversations that resend their whole history (system prompt, earlier turns) each turn."""
    conversations, turns = args.num_requests or 8, 4
    system_len, user_len = args.input_len or 512, 16
    answer_len = args.output_len or 32
    rng = np.random.default_rng(args.seed)
    system = _random_ids(rng, allowed, system_len)
    user_msgs = [[_random_ids(rng, allowed, user_len) for _ in range(turns)] for _ in range(conversations)]
    params = SamplingParams(temperature=0, max_tokens=answer_len, ignore_eos=True)
    results = []
    for caching in (True, False):
        llm = make_llm(enable_prefix_caching=caching)
        engine = llm.llm_engine
        histories = [list(system) for _ in range(conversations)]
        per_turn = []
        for turn in range(turns):
            prompts = [h + user_msgs[c][turn] for c, h in enumerate(histories)]
            q0, h0, p0 = (engine.kv_cache.prefix_cache_queries, engine.kv_cache.prefix_cache_hits,
                          engine.stats.prompt_tokens)
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            queries = engine.kv_cache.prefix_cache_queries - q0
            hits = engine.kv_cache.prefix_cache_hits - h0
            ttft = [(o.metrics.first_token_time - o.metrics.arrival_time) * 1000 for o in outs]
            per_turn.append({"turn": turn + 1, "prompt_tokens": sum(map(len, prompts)),
                             "prefill_tokens_computed": engine.stats.prompt_tokens - p0,
                             "hit_rate": hits / queries if queries else 0.0,
                             "ttft_ms_mean": float(np.mean(ttft))})
            histories = [p + list(o.outputs[0].token_ids) for p, o in zip(prompts, outs)]
        del llm
        gc.collect()
        later = per_turn[1:]
        results.append({"name": "multi-turn", "engine": "folovllm", "prefix_caching": caching,
                        "conversations": conversations, "turns": turns, "system_len": system_len,
                        "user_len": user_len, "answer_len": answer_len, "per_turn": per_turn,
                        "hit_rate_from_turn_2": float(np.mean([t["hit_rate"] for t in later]))})
    print(f"multi-turn: {conversations} conversations x {turns} turns, {system_len}-token system prompt, "
          f"{user_len}-token user messages, {answer_len}-token answers")
    for row in results:
        print(f"  caching {'on ' if row['prefix_caching'] else 'off'}:")
        for t in row["per_turn"]:
            print(f"    turn {t['turn']}: prefill computed {t['prefill_tokens_computed']:>6} / "
                  f"{t['prompt_tokens']} tokens, hit rate {t['hit_rate']:.1%}, mean TTFT {t['ttft_ms_mean']:.0f} ms")
    return results


def run_prefix_workload(args: argparse.Namespace) -> list[dict[str, Any]]:
    from folovllm import LLM
    from folovllm.engine.args import engine_config_from_args
    from folovllm.model.loader import default_model_path, load_arch_config
    from folovllm.model.loader.hub import resolve_model_files
    from folovllm.model.loader.tokenizer import load_tokenizer

    config = resolve_model_files(engine_config_from_args(args))

    def make_llm(**overrides):
        return LLM(**{**vars(config), **overrides})

    model = config.model or default_model_path()
    allowed = _allowed_ids(load_tokenizer(config.tokenizer or model),
                           load_arch_config(model, config.hf_overrides).vocab_size)
    runner = run_shared_prefix if args.workload == "shared-prefix" else run_multi_turn
    results = runner(args, make_llm, allowed)
    if args.output_json:
        write_results(results, args.output_json)
    return results

