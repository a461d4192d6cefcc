"""The timed phases of compare.py: offline workloads in worker processes, the servers under one client,
and llama.cpp's batched bench beside our variants. Each phase alternates who goes first every round, waits
for a quiet machine before a timed run and returns its runs, medians, start-up times and peak memory."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import psutil

import llama_cpp
import report
from engines import Process, Server, Setup, Worker, label, run_client
from machine import PeakRss, Window, wait_quiet
from workloads import CHECK_MAX_TOKENS, METRICS, WARMUP, Workload, build_requests

SERVE_SHAPE = {"num_prompts": 64, "input_len": 10, "output_len": 128}
LLAMA_SHAPE = {"prompt": 16, "generate": 128}  # llama-batched-bench -npp 16 -ntg 128
KEPT_OUTPUTS = 8  # outputs per workload (first round) compared between the engines


class Timer:
    """Timed runs on a shared machine: wait for quiet, run, retry when others took too much CPU.
    Past ``deadline`` (time.monotonic) it neither waits nor retries, so a busy machine still ends the run."""

    def __init__(self, threshold: float, max_wait_s: float, attempts: int, deadline: float = float("inf")) -> None:
        self.threshold, self.max_wait_s, self.attempts, self.deadline = threshold, max_wait_s, attempts, deadline

    def patient(self) -> bool:
        return time.monotonic() < self.deadline

    def wait_quiet(self) -> float:
        """Seconds waited for a quiet machine (none past the deadline)."""
        return wait_quiet(self.threshold, self.max_wait_s)[1] if self.patient() else 0.0

    def run(self, engine: psutil.Process, fn: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        """``fn()``'s result from the least disturbed attempt, and how disturbed the attempts were."""
        tries, waited = [], 0.0
        for _ in range(self.attempts):
            waited += self.wait_quiet()
            window = Window(engine)
            result = fn()
            tries.append((window.share(), result))
            if tries[-1][0] < self.threshold or not self.patient():
                break
        share, result = min(tries, key=lambda t: t[0])
        return result, {"others_share": share, "attempt_shares": [t[0] for t in tries], "waited_s": waited}


def order(engines: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    """Who goes first moves on every round (two engines: flips)."""
    shift = round_index % len(engines)
    rotated = engines[shift:] + engines[:shift]
    return rotated if len(engines) > 2 or round_index % 2 == 0 else tuple(reversed(engines))


def start_all(engines: tuple[str, ...], make: Callable[[str], Process], ready: Callable[[Process], dict[str, Any]],
              timer: Timer, rss: PeakRss) -> tuple[dict[str, Process], dict[str, Any]]:
    """Starts one engine after the other (each on a quiet machine), timing spawn → first token."""
    procs, startup = {}, {}
    try:
        for engine in engines:
            timer.wait_quiet()
            proc = procs[engine] = make(engine)
            window = Window(proc.proc)  # the tree is counted as it is at the end: the engine's own children too
            rss.watch(proc.popen.pid)
            info = ready(proc)
            startup[engine] = {**info, "others_share": window.share()}
            print(f"  {label(engine)} up: first token {info['first_token_s']:.1f} s after spawn", flush=True)
    except BaseException:
        for proc in procs.values():
            proc.close()
        raise
    return procs, startup


def worker_ready(worker: Process) -> dict[str, Any]:
    info = worker.reply(timeout_s=900.0)
    if info.get("event") != "ready":
        raise worker.died(f"expected the ready message, got {info}")
    return {**info, "first_token_s": time.monotonic() - worker.spawned, "worker_first_token_s": info["first_token_s"]}


def sessions(engines: tuple[str, ...], rounds: int, one_at_a_time: bool) -> list[tuple[tuple[str, ...], range]]:
    """The engines a phase has up together and the rounds they run: all of them for every round, or
    (``one_at_a_time``: a model too big for two in memory) each alone for one round, in each round's order."""
    if not one_at_a_time:
        return [(engines, range(rounds))]
    return [((engine,), range(r, r + 1)) for r in range(rounds) for engine in order(engines, r)]


def offline_phase(setup: Setup, engines: tuple[str, ...], workloads: tuple[Workload, ...], rounds: int,
                  timer: Timer, check_prompts: list[list[int]], one_at_a_time: bool = False) -> dict[str, Any]:
    print(f"offline: {', '.join(map(label, engines))}{' (one at a time)' if one_at_a_time else ''}", flush=True)
    requests = {wl.name: build_requests(wl) for wl in workloads}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {wl.name: {e: [] for e in engines} for wl in workloads}
    kept: dict[str, dict[str, list[list[int]]]] = {}
    check: dict[str, list[list[int]]] = {}
    startup: dict[str, Any] = {}
    peak: dict[str, float] = {}
    for group, group_rounds in sessions(engines, rounds, one_at_a_time):
        rss = PeakRss()
        workers, started = start_all(group, lambda e: Worker(e, setup), worker_ready, timer, rss)
        for engine, info in started.items():
            startup.setdefault(engine, info)
        try:
            for w in workers.values():
                w.generate(build_requests(WARMUP))
            for r in group_rounds:
                for wl in workloads:
                    for engine in (e for e in order(engines, r) if e in workers):
                        worker = workers[engine]
                        done, meta = timer.run(worker.proc, lambda: worker.generate(requests[wl.name], KEPT_OUTPUTS))
                        if done["output_tokens"] != sum(q["max_tokens"] for q in requests[wl.name]):
                            raise RuntimeError(f"{engine} on {wl.name}: {done['output_tokens']} output tokens, "
                                               "not the sum of max_tokens (ignore_eos)")
                        rates = report.run_rates(done["wall_s"], done["input_tokens"], done["output_tokens"])
                        runs[wl.name][engine].append({"value": rates[wl.metric], "wall_s": done["wall_s"], **meta})
                        kept.setdefault(wl.name, {}).setdefault(engine, done["token_ids"])
                        print(f"  round {r + 1}/{rounds} {wl.name:<14} {engine:<10} "
                              f"{rates[wl.metric]:9.1f} {METRICS[wl.metric][0]:<20} others {meta['others_share']:.0%}"
                              + (f" (attempts {len(meta['attempt_shares'])})" if len(meta["attempt_shares"]) > 1 else ""),
                              flush=True)
            for e in group:
                if e not in check:
                    check[e] = workers[e].generate([{"prompt_token_ids": p, "max_tokens": CHECK_MAX_TOKENS}
                                                    for p in check_prompts], keep_tokens=len(check_prompts))["token_ids"]
                peak[e] = max(peak.get(e, 0.0), rss.peak_mib(workers[e].popen.pid))
        finally:
            for w in workers.values():
                w.close()
            rss.stop()
    results = []
    for wl in workloads:
        figure, higher = METRICS[wl.metric]
        entry = {"name": wl.name, "shape": wl.shape, "kind": wl.kind, "metric": wl.metric, "figure": figure,
                 "higher_is_better": higher, "runs": runs[wl.name],
                 "median": {e: report.median([x["value"] for x in runs[wl.name][e]]) for e in engines}}
        results.append(entry)
    # greedy agreement: vLLM's first variant against ours (the default where it ran), both unquantized
    pair = ([e for e in engines if report.is_vllm(e)][:1] + [e for e in engines if e in ("folo", "folo-bf16",
                                                                                           "folo-fp32")][:1])
    match = None
    if len(pair) == 2:
        a, b = pair
        match = {"engines": pair, "check_prompts": report.agreement(check[a], check[b]),
                 "workloads": report.agreement([t for wl in workloads for t in kept[wl.name][a]],
                                               [t for wl in workloads for t in kept[wl.name][b]])}
    return {"engines": list(engines), "one_at_a_time": one_at_a_time, "startup": startup, "peak_rss_mib": peak,
            "workloads": results, "greedy_match": match}


def serve_phase(setup: Setup, engines: tuple[str, ...], rates: list[float], rounds: int, timer: Timer,
                scratch: Path) -> dict[str, Any]:
    print(f"server: starting {', '.join(map(label, engines))}", flush=True)
    rss = PeakRss()
    servers, startup = start_all(engines, lambda e: Server(e, setup), lambda s: s.wait_first_token(), timer, rss)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {f"{r:g}": {e: [] for e in engines} for r in rates}
    try:
        for engine, server in servers.items():  # warm-up, not timed
            run_client(setup, server.base_url, scratch / f"warmup-{engine}.json", rate=float("inf"),
                       num_prompts=8, input_len=10, output_len=16)
        for r in range(rounds):
            for rate in rates:
                for engine in order(engines, r):
                    server = servers[engine]
                    out = scratch / f"serve-{engine}-rate{rate:g}-round{r}.json"
                    res, meta = timer.run(server.proc, lambda: run_client(setup, server.base_url, out, rate=rate,
                                                                          **SERVE_SHAPE))
                    figures = {"output_tok_s": res["output_tok_s"], "tpot_ms_mean": res["tpot_ms"]["mean"],
                               "ttft_ms_mean": res["ttft_ms"]["mean"]}
                    runs[f"{rate:g}"][engine].append({**figures, **meta})
                    print(f"  round {r + 1}/{rounds} rate {rate:g} {engine:<10} "
                          f"{figures['output_tok_s']:7.1f} output tok/s, TPOT {figures['tpot_ms_mean']:5.1f} ms, "
                          f"others {meta['others_share']:.0%}", flush=True)
        peak = {e: rss.peak_mib(s.popen.pid) for e, s in servers.items()}
    finally:
        for s in servers.values():
            s.close()
        rss.stop()
    medians = {rate: {e: {k: report.median([x[k] for x in by_engine[e]])
                          for k in ("output_tok_s", "tpot_ms_mean", "ttft_ms_mean")} for e in engines}
               for rate, by_engine in runs.items()}
    return {"engines": list(engines), "shape": SERVE_SHAPE, "startup": startup, "peak_rss_mib": peak, "runs": runs,
            "median": medians}


def llama_phase(setup: Setup, engines: tuple[str, ...], parallel: list[int], rounds: int, timer: Timer,
                tier: str, one_at_a_time: bool = False) -> dict[str, Any]:
    """llama.cpp's batched bench on the GGUF against our engines on the same shapes: n streams x 16 prompt
    tokens x 128 new, for each n in ``parallel``; rounds alternate who goes first. llama.cpp's figure is its
    generation rate (S_TG, prompts excluded); ours is output tokens over the whole run (the 16-token prompts
    included), so that comparison leans its way; beside it, ours over the decode phase alone (from the last
    first token on, as llama.cpp times generation). Peak RSS of every side beside its speed."""
    shapes = [Workload(f"batched_{n}", n, LLAMA_SHAPE["prompt"], LLAMA_SHAPE["generate"], seed=10 + n,
                       metric="output_tok_s") for n in parallel]
    print(f"llama.cpp ({tier} build) on {setup.gguf.name} against {', '.join(map(label, engines))}", flush=True)
    sides = ("llama.cpp", *engines)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {wl.name: {e: [] for e in sides} for wl in shapes}
    commands: list[list[str]] = []
    startup: dict[str, Any] = {}
    peak: dict[str, float] = {}
    # llama.cpp is a process per run: it joins every session (alone, one at a time)
    for group, group_rounds in sessions(sides, rounds, one_at_a_time):
        rss = PeakRss()
        ours = tuple(e for e in group if e != "llama.cpp")
        workers, started = start_all(ours, lambda e: Worker(e, setup), worker_ready, timer, rss)
        for engine, info in started.items():
            startup.setdefault(engine, info)
        try:
            for w in workers.values():
                w.generate(build_requests(WARMUP))
            for r in group_rounds:
                for side in (s for s in order(sides, r) if s in group):
                    if side == "llama.cpp":
                        res, meta = timer.run(None, lambda: llama_cpp.batched_bench(
                            tier, setup.gguf, LLAMA_SHAPE["prompt"], LLAMA_SHAPE["generate"], parallel,
                            setup.threads))
                        commands.append(res["command"])
                        peak[side] = max(peak.get(side, 0.0), res["peak_rss_mib"])
                        for wl, n in zip(shapes, parallel):
                            row = res["rows"][n]
                            runs[wl.name][side].append({"value": row["tg_tok_s"], "ms_per_step": row["ms_per_token"],
                                                        "decode_tok_s": row["tg_tok_s"],
                                                        "decode_ms_per_step": row["ms_per_token"],
                                                        "pp_tok_s": row["pp_tok_s"], **meta})
                            print(f"  round {r + 1}/{rounds} {wl.name:<11} llama.cpp  {row['tg_tok_s']:8.1f} tg tok/s "
                                  f"({row['ms_per_token']:.1f} ms/step) others {meta['others_share']:.0%}", flush=True)
                        continue
                    for wl in shapes:
                        done, meta = timer.run(workers[side].proc, lambda: workers[side].generate(build_requests(wl)))
                        rates = report.run_rates(done["wall_s"], done["input_tokens"], done["output_tokens"])
                        ms_per_step = 1000.0 * done["wall_s"] / wl.output_len
                        steps = wl.output_len - 1  # decode steps after each request's first token
                        decode = {} if done.get("decode_s") is None else {  # an engine that keeps no token times
                            "decode_tok_s": wl.num_requests * steps / done["decode_s"],
                            "decode_ms_per_step": 1000.0 * done["decode_s"] / steps}
                        runs[wl.name][side].append({"value": rates["output_tok_s"], "ms_per_step": ms_per_step,
                                                    **decode, **meta})
                        timed = f"; decode {decode['decode_ms_per_step']:.1f} ms/step" if decode else ""
                        print(f"  round {r + 1}/{rounds} {wl.name:<11} {side:<10} {rates['output_tok_s']:8.1f} output "
                              f"tok/s ({ms_per_step:.1f} ms/step{timed}) others {meta['others_share']:.0%}", flush=True)
            for e, w in workers.items():
                peak[e] = max(peak.get(e, 0.0), rss.peak_mib(w.popen.pid))
        finally:
            for w in workers.values():
                w.close()
            rss.stop()
    medians = {wl.name: {e: {k: report.median([x[k] for x in runs[wl.name][e]])
                             for k in ("value", "ms_per_step", "decode_tok_s", "decode_ms_per_step")
                             if all(k in x for x in runs[wl.name][e])}
                         for e in sides} for wl in shapes}
    return {"engines": list(engines), "tier": tier, "gguf": str(setup.gguf), "gguf_mib": setup.gguf.stat().st_size / 2**20,
            "shape": LLAMA_SHAPE, "parallel": parallel, "one_at_a_time": one_at_a_time, "commands": commands[:1],
            "startup": startup, "peak_rss_mib": peak, "runs": runs, "median": medians}
