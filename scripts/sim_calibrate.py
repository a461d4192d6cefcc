"""Fits the CPU simulator profile: serves with a step trace, runs the calibration workloads, fits.

    .venv/bin/python scripts/sim_calibrate.py                 # writes folovllm/simulator/profiles/cpu-smollm2-135m.json
    .venv/bin/python scripts/sim_calibrate.py --out /tmp/p.json --keep-trace /tmp/steps.jsonl

Starts `folovllm serve --trace` (max_model_len 2048, default engine settings), runs `folovllm bench serve`
on each calibration workload, then `folovllm simulate calibrate` on the trace. The workloads are none of
scripts/sim_fidelity.py's: random prompts at a moderate rate and in a burst (no prefix-cache hits), and two
low-rate shared-prefix streams with different prefix lengths, whose prefill steps run new tokens over a
cached prefix and whose decode steps have one or two rows. Then a dozen lone one-token requests measure
the API server's time per request (from sending to the engine step that takes it), and a few bursts of
one-token requests sent at once by bench serve's own client (a connection each) its time per request
of a burst (from sending to the engine step that has taken the whole burst, less the lone request's
time, per request after the first), which the profile keeps for the simulator. About three minutes on a quiet 2-core
machine. Before each workload and after the last it runs the machine-speed probe
(folovllm/simulator/speed.py) and keeps the mean of those in the profile, so that scripts/sim_fidelity.py can
compare its live runs at the same machine speed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from folovllm.bench.datasets import ServeRequest
from folovllm.bench.serve import run_benchmark
from folovllm.simulator.live import (
    CLI,
    PROFILE,
    send_probe,
    start_server,
    steps_between,
    threads_args,
)
from folovllm.simulator.speed import combine, probe_of

ROOT = Path(__file__).resolve().parent.parent

MAX_MODEL_LEN = 2048
NUM_KV_BLOCKS = 5825  # what `folovllm serve --max-model-len 2048` allocates on the calibration machine
WORKLOADS = {
    "random-rate3": ["--dataset", "random", "--input-len-range", "16:512", "--output-len-range", "8:96",
                     "--request-rate", "3", "--num-prompts", "90", "--seed", "5"],
    "random-burst": ["--dataset", "random", "--input-len-range", "16:1024", "--output-len-range", "8:128",
                     "--request-rate", "inf", "--num-prompts", "40", "--seed", "6"],
    "shared-prefix-192": ["--dataset", "shared-prefix", "--prefix-len", "192", "--input-len-range", "16:160",
                          "--output-len-range", "16:64", "--request-rate", "1.5", "--num-prompts", "30",
                          "--seed", "21"],
    "shared-prefix-896": ["--dataset", "shared-prefix", "--prefix-len", "896", "--input-len-range", "16:160",
                          "--output-len-range", "16:64", "--request-rate", "1.5", "--num-prompts", "30",
                          "--seed", "22"],
}


def send_lone_requests(port: int, num: int = 12) -> list[float]:
    """Sends ``num`` one-token requests one at a time to the idle server; returns when each was sent."""
    sends = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        for i in range(num):
            prompt = [1000 + 97 * i + k for k in range(16)]
            sends.append(time.perf_counter())
            http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1,
                                               "temperature": 0.0}).raise_for_status()
            time.sleep(0.2)
    return sends


BURST_SIZE, BURST_PROMPT_LEN = 24, 16


def send_bursts(port: int, num: int = 5) -> list[float]:
    """Sends ``num`` bursts of ``BURST_SIZE`` one-token requests (fresh prompts, so no prefix-cache hit) with
    bench serve's client, each after the last has ended; returns when each burst was sent."""
    base_url = f"http://127.0.0.1:{port}"
    model = httpx.get(f"{base_url}/v1/models").json()["data"][0]["id"]
    sends = []
    for b in range(num):
        first = 20000 + b * BURST_SIZE * BURST_PROMPT_LEN
        burst = [ServeRequest([first + i * BURST_PROMPT_LEN + k for k in range(BURST_PROMPT_LEN)], 1, BURST_PROMPT_LEN)
                 for i in range(BURST_SIZE)]
        outcomes = asyncio.run(run_benchmark(burst, [0.0] * BURST_SIZE, base_url=base_url, endpoint="completions",
                                             model=model, progress=False))
        if not all(o.success for o in outcomes):
            raise SystemExit(f"a calibration burst failed: {next(o.error for o in outcomes if not o.success)}")
        sends.append(min(o.send_time for o in outcomes))
        time.sleep(0.3)
    return sends


def api_server_burst_s(trace: Path, sends: list[float], lone_s: float) -> float:
    """Median over the bursts of (time from sending a burst to the start of the engine step that has taken
    all of it, less the lone request's ``lone_s``) / (``BURST_SIZE`` - 1): the simulator delays a burst of N
    by N - 1 times this beyond a lone request's delay; 0 if that comes out negative. The step is the one
    whose prefill tokens, summed from the send on, reach the burst's."""
    records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    steps = sorted((r["time"] - r["duration_s"], r["num_prefill_tokens"]) for r in records if r["num_scheduled"])
    per_request = []
    for send in sends:
        taken = 0
        for start, prefill in steps:
            if start < send:
                continue
            taken += prefill
            if taken >= BURST_SIZE * BURST_PROMPT_LEN:
                per_request.append((start - send - lone_s) / (BURST_SIZE - 1))
                break
    return max(0.0, float(np.median(per_request))) if per_request else 0.0


def api_server_s(trace: Path, sends: list[float]) -> float:
    """Median time from sending a lone request to the start of the engine step that takes it: the API
    server's path, the engine core's inbox and the idle loop waking (the trace and this client share
    ``time.perf_counter``, one machine)."""
    records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    starts = np.sort([r["time"] - r["duration_s"] for r in records if r["num_scheduled"]])
    delays = [starts[i] - send for send in sends if (i := np.searchsorted(starts, send)) < len(starts)]
    return float(np.median(delays))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(PROFILE), help="where to write the profile")
    parser.add_argument("--keep-trace", default=None, metavar="PATH", help="also copy the step trace here")
    parser.add_argument("--num-kv-blocks", type=int, default=NUM_KV_BLOCKS,
                        help="the served engine's KV blocks (its log says it), kept as the profile's default")
    parser.add_argument("--weighting", choices=("absolute", "sqrt", "relative"), default="absolute",
                        help="simulate calibrate's --weighting")
    parser.add_argument("--prefill-knee", default="auto", help="simulate calibrate's --prefill-knee (auto or tokens)")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="the server's --num-threads (default: its own); sim_fidelity.py should run with the same")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="sim-calibrate-"))
    trace = folder / "steps.jsonl"
    proc, port = start_server(MAX_MODEL_LEN, trace, threads_args(args.num_threads))
    probes = []
    try:
        for index, (name, argv) in enumerate(WORKLOADS.items()):
            probes.append(send_probe(port, index))
            print(f"calibration workload {name}", flush=True)
            done = subprocess.run([*CLI, "bench", "serve", "--port", str(port), "--no-progress", *argv], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                raise SystemExit(f"bench serve failed on {name}:\n{done.stderr}")
        probes.append(send_probe(port, len(WORKLOADS)))
        sends = send_lone_requests(port)
        bursts = send_bursts(port)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if args.keep_trace:
        shutil.copyfile(trace, args.keep_trace)
    speed = combine([probe_of(steps_between(trace, *window)) for window in probes])
    print(f"machine-speed probe: one-row decode step {speed['decode_step_s'] * 1e3:.2f} ms, prefill step "
          f"{speed['prefill_step_s'] * 1e3:.1f} ms (the mean of {len(probes)} probes)", flush=True)
    api_server_ms = api_server_s(trace, sends) * 1e3
    burst_ms = api_server_burst_s(trace, bursts, api_server_ms / 1e3) * 1e3
    print(f"API server: {api_server_ms:.2f} ms from sending a lone request to its engine step, {burst_ms:.2f} ms "
          f"more per request after the first of a burst of {BURST_SIZE}", flush=True)
    subprocess.run([*CLI, "simulate", "calibrate", "--trace", str(trace), "--out", args.out,
                    "--name", Path(PROFILE).stem, "--num-kv-blocks", str(args.num_kv_blocks),
                    "--max-model-len", str(MAX_MODEL_LEN), "--model", "SmolLM2-135M-Instruct",
                    "--weighting", args.weighting, "--api-server-ms", f"{api_server_ms:.4f}",
                    "--api-server-burst-ms", f"{burst_ms:.4f}", "--speed-probe-ms",
                    f"{speed['decode_step_s'] * 1e3:.4f}", f"{speed['prefill_step_s'] * 1e3:.4f}",
                    "--prefill-knee", args.prefill_knee], cwd=ROOT, check=True)
    print(f"the trace is in {trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
