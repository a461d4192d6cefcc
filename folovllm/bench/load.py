"""``folovllm bench load``: how long a model takes from nothing to an engine ready to serve, and its memory.

    folovllm bench load model.gguf --rounds 3
    folovllm bench load 3b.gguf 8b.gguf --switch FOLOVLLM_GGUF_FAST_LOAD=off,on --rounds 3 --out load.json

Each load runs in a fresh process (a second load in one process would find the first's memory and caches):
``LLM(model)`` with the engine's defaults and ``--max-model-len``, timed from before its construction to an
engine ready to take requests (the weights loaded and placed, the KV cache reserved), and the process's
peak RSS. With ``--switch``,
the variable's two values alternate round by round (which goes first alternates too); the figures are medians.
The files are read once first, so every load finds them in the page cache (a cold read is the disk's time).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from folovllm.bench.results import bench_command
from folovllm.bench.switch import switch_from_text

FIGURES = ("ready_s", "peak_rss_mib")


def add_load_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="+", help="models to load (a .gguf file or an HF folder)")
    parser.add_argument("--switch", default=None,
                        help="NAME=A,B: a FOLOVLLM_* variable's two values, alternating (e.g. "
                             "FOLOVLLM_GGUF_FAST_LOAD=off,on)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the result JSON here")


def parse_variable_switch(text: str | None) -> tuple[str | None, tuple[str, ...]]:
    """``NAME=A,B`` -> (NAME, (A, B)) for a FOLOVLLM_* variable; None -> (None, ("",)): the environment as it is."""
    if text is None:
        return None, ("",)
    switch = switch_from_text(text)
    if not switch.is_variable:
        raise ValueError(f"--switch names a FOLOVLLM_* variable (`folovllm --help-env`): a load takes the engine's "
                         f"defaults, got {switch.name!r}")
    return switch.name, switch.values


def load_here(model: str, max_model_len: int) -> dict[str, float]:
    """One load in this process: seconds to a ready engine and the process's peak RSS (MiB)."""
    from folovllm import LLM

    start = time.perf_counter()
    LLM(model, max_model_len=max_model_len)
    return {"ready_s": time.perf_counter() - start,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def load_once(model: str, max_model_len: int, variable: str | None, value: str) -> dict[str, float]:
    """``load_here`` in a fresh process, with ``variable`` set to ``value`` where one is given."""
    env = dict(os.environ)
    if variable is not None:
        env[variable] = value
    code = ("import json, sys; from folovllm.bench.load import load_here; "
            "print(json.dumps(load_here(sys.argv[1], int(sys.argv[2]))))")
    done = subprocess.run([sys.executable, "-c", code, model, str(max_model_len)], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"loading {model} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _read_through(model: str) -> None:
    """Every file of ``model`` read once, into the page cache."""
    path = Path(model)
    for file in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
        with open(file, "rb") as f:
            while f.read(64 << 20):
                pass


def run_bench_load(args: argparse.Namespace) -> dict[str, Any]:
    variable, values = parse_variable_switch(args.switch)
    for model in args.models:
        if not Path(model).exists():
            raise ValueError(f"no such model file or folder: {model}")
        _read_through(model)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {m: {v: [] for v in values} for m in args.models}
    for r in range(args.rounds):
        for model in args.models:
            for value in values if r % 2 == 0 else values[::-1]:
                figures = load_once(model, args.max_model_len, variable, value)
                runs[model][value].append(figures)
                side = f" {variable}={value}" if variable else ""
                print(f"round {r + 1}/{args.rounds} {Path(model).name}{side}: ready in {figures['ready_s']:.2f} s, "
                      f"peak RSS {figures['peak_rss_mib']:.0f} MiB", flush=True)
    from folovllm.platforms import isa

    result: dict[str, Any] = {
        "command": bench_command("load"),
        "cpu": isa.cpu_model_name(), "isa": isa.host_tier(), "cpus": os.cpu_count(), "variable": variable,
        "max_model_len": args.max_model_len, "models": {}}
    for model, by_value in runs.items():
        medians = {v: {k: statistics.median(x[k] for x in by_value[v]) for k in FIGURES} for v in values}
        result["models"][Path(model).name] = {"runs": by_value, "median": medians}
        for v, m in medians.items():
            side = f" {variable}={v}" if variable else ""
            print(f"{Path(model).name}{side}: median ready {m['ready_s']:.2f} s, peak RSS {m['peak_rss_mib']:.0f} MiB")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result
