"""How long a GGUF file takes to load in its own types for our kernel (``load_model`` with load_quantized, as
the engine's worker calls it), with FOLOVLLM_GGUF_FAST_LOAD off and on: each load in a fresh process, the two
alternating round by round; per round the seconds inside ``load_model`` and the process's peak RSS, then the
medians, written as JSON.

    python benchmarks/gguf_load.py FILE.gguf [FILE.gguf ...] --rounds 3 --out docs/results/gguf-load-time.json

The files are read once first, so every load finds them in the page cache (a cold read is the disk's time).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("off", "on")
# one load in a fresh process: its seconds inside load_model, then the process's peak RSS (Linux: KiB)
LOAD = """
import resource, sys, time
import torch
from folovllm.model.loader import load_model
from folovllm.platforms import platform_for
platform = platform_for("cpu")
start = time.perf_counter()
load_model(sys.argv[1], dtype=torch.bfloat16, device="cpu", load_quantized=True, quantize_lm_head="auto",
           platform=platform)
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def load_once(path: str, mode: str) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one load of ``path`` with FOLOVLLM_GGUF_FAST_LOAD=``mode``."""
    env = {**os.environ, "FOLOVLLM_GGUF_FAST_LOAD": mode, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", LOAD, path], env=env, capture_output=True, text=True, check=True)
    seconds, rss_kib = done.stdout.split()[-2:]
    return float(seconds), float(rss_kib) / 1024


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help=".gguf files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the result JSON here")
    args = parser.parse_args()
    for path in args.files:
        warm(path)
    runs = {path: {mode: [] for mode in MODES} for path in args.files}
    for round_ in range(args.rounds):
        for path in args.files:
            for mode in MODES:
                seconds, rss = load_once(path, mode)
                runs[path][mode].append({"load_s": round(seconds, 2), "peak_rss_mib": round(rss)})
                print(f"round {round_ + 1} {Path(path).name} FOLOVLLM_GGUF_FAST_LOAD={mode}: {seconds:.2f} s, "
                      f"peak RSS {rss:.0f} MiB", flush=True)
    from folovllm.platforms import isa

    result = {"command": shlex.join(["python", "benchmarks/gguf_load.py", *sys.argv[1:]]),
              "cpu": isa.cpu_model_name(), "isa": isa.host_tier(), "cpus": os.cpu_count(), "files": {}}
    for path, modes in runs.items():
        medians = {mode: {key: statistics.median(r[key] for r in modes[mode]) for key in ("load_s", "peak_rss_mib")}
                   for mode in MODES}
        result["files"][Path(path).name] = {"runs": modes, "median": medians,
                                            "speedup": round(medians["off"]["load_s"] / medians["on"]["load_s"], 1)}
        print(f"{Path(path).name}: median {medians['off']['load_s']:.2f} s off, {medians['on']['load_s']:.2f} s on")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
