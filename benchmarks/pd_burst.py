"""Bursts of long prompts against steady decodes: colocated serving vs prefill/decode disaggregation.

Eight background streams (short prompts, long outputs, always eight running) decode while every few
seconds a burst of long prompts arrives. Each configuration is launched here, on this machine:

  a  one colocated server on both cores, chunked prefill on
  b  the same with --no-chunked-prefill
  c  data parallelism: --data-parallel-size 2
  d  PD: a producer pinned to core 0 and a consumer pinned to core 1 (one thread each), the proxy in front

    .venv/bin/python benchmarks/pd_burst.py --configs a,b --duration 60
    .venv/bin/python benchmarks/pd_burst.py --configs a,b,c,d --duration 120 --burst-intervals 2,3,5

Every configuration runs once without bursts (its baseline ITL) and once per burst interval, all of it
``--repeats`` times (each burst run against its own round's baseline; the median ratio is reported too).
Writes a JSON and a PNG (background ITL over time of the first round, bursts marked) and prints a
markdown table.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from folovllm.bench.burst import (BACKGROUND, BURST, StreamRecord, add_no_burst_ratios,  # noqa: E402
                                  itl_over_time, markdown_table, median_ratios, median_table,
                                  plot_itl_timelines, summarize_run)
from folovllm.bench.datasets import PromptMaker, ServeRequest, parse_len_range  # noqa: E402
from folovllm.bench.serve_client import send_request, wait_for_health  # noqa: E402

CONFIGS = {"a": "colocated-chunked", "b": "colocated-no-chunk", "c": "dp2", "d": "pd"}
SERVED_NAME = "pdbench"


@dataclass
class Process:
    """A subprocess in its own process group, its output in a log file."""

    name: str
    cmd: list[str]
    log: Path
    cpus: set[int] | None = None
    proc: subprocess.Popen | None = field(default=None, init=False)

    def start(self) -> "Process":
        pin = (lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                         start_new_session=True, preexec_fn=pin)
        return self

    def failure(self) -> RuntimeError:
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return RuntimeError(f"{self.name} exited with {self.proc.returncode}; log {self.log}:\n{tail}")

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, procs: list[Process], timeout_s: float) -> None:
    def check() -> None:
        for p in procs:
            if p.proc.poll() is not None:
                raise p.failure()

    if not wait_for_health(url, timeout_s, check, poll_s=0.5):
        raise RuntimeError(f"{url} was not healthy after {timeout_s:.0f} s (logs beside: {[str(p.log) for p in procs]})")


def serve_cmd(args: argparse.Namespace, port: int, *extra: str) -> list[str]:
    model = [args.model] if args.model else []
    return [sys.executable, "-m", "folovllm.entrypoints.cli", "serve", *model, "--port", str(port),
            "--served-model-name", SERVED_NAME, "--log-level", "warning", *args.serve_args.split(), *extra]


def trace_args(args: argparse.Namespace, role: str) -> list[str]:
    """``--trace`` for one PD instance when --pd-trace-dir is set (the folder is made), else nothing."""
    if not args.pd_trace_dir:
        return []
    Path(args.pd_trace_dir).mkdir(parents=True, exist_ok=True)
    return ["--trace", str(Path(args.pd_trace_dir) / f"{role}.jsonl")]


def launch(config: str, args: argparse.Namespace, logs: Path) -> tuple[str, list[Process], str | None]:
    """Starts one configuration; returns the URL clients use, its processes (healthy), and for PD the
    consumer's URL (its /metrics count the KV transfers)."""
    if config in ("a", "b", "c"):
        port = free_port()
        extra = {"a": ["--num-threads", "2"], "b": ["--num-threads", "2", "--no-chunked-prefill"],
                 "c": ["--num-threads", "2", "--data-parallel-size", "2"]}[config]
        procs = [Process(CONFIGS[config], serve_cmd(args, port, *extra), logs / f"{CONFIGS[config]}.log").start()]
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, procs, args.start_timeout)
        return url, procs, None
    connector = ["--kv-connector", args.pd_connector]
    if args.pd_connector == "shared_storage":
        storage = tempfile.mkdtemp(prefix="pd-burst-kv-")
        connector += ["--kv-transfer-config", json.dumps({"kv_connector_extra_config": {"shared_storage_path": storage}})]
    p_port, d_port, proxy_port = free_port(), free_port(), free_port()
    producer = Process("producer", serve_cmd(args, p_port, "--num-threads", "1", "--kv-role", "producer", *connector,
                                             *trace_args(args, "producer")),
                       logs / "pd-producer.log", cpus={0}).start()
    consumer = Process("consumer", serve_cmd(args, d_port, "--num-threads", "1", "--kv-role", "consumer", *connector,
                                             *trace_args(args, "consumer")),
                       logs / "pd-consumer.log", cpus={1}).start()
    procs = [producer, consumer]
    wait_healthy(f"http://127.0.0.1:{p_port}", procs, args.start_timeout)
    wait_healthy(f"http://127.0.0.1:{d_port}", procs, args.start_timeout)
    proxy = Process("proxy", [sys.executable, "-m", "folovllm.entrypoints.cli", "proxy",
                              "--prefill", f"http://127.0.0.1:{p_port}", "--decode", f"http://127.0.0.1:{d_port}",
                              "--port", str(proxy_port), "--log-level", "warning"], logs / "pd-proxy.log",
                    cpus=args.front_cpus).start()
    procs.append(proxy)
    url = f"http://127.0.0.1:{proxy_port}"
    wait_healthy(url, procs, 60.0)
    return url, procs, f"http://127.0.0.1:{d_port}"


def record_of(kind: str, outcome, start: float) -> StreamRecord:
    return StreamRecord(kind, outcome.send_time - start, [t - start for t in outcome.chunk_times],
                        outcome.output_tokens, outcome.error)


async def drive(url: str, args: argparse.Namespace, interval: float | None, seed: int) -> tuple[list[StreamRecord], list[float]]:
    """Background streams for ``args.duration`` seconds, plus a burst every ``interval`` seconds
    (none when None); waits for what is in flight to end. Returns the records and burst send times."""
    maker = PromptMaker("ids", np.random.default_rng(seed))
    burst_lens = parse_len_range(args.burst_input_len, "--burst-input-len")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600.0, connect=30.0), limits=limits) as http:
        start = time.perf_counter()
        end = start + args.duration
        records: list[StreamRecord] = []

        async def background() -> None:
            while time.perf_counter() < end:
                req = ServeRequest(maker.make(args.background_input_len), args.background_output_len,
                                   args.background_input_len)
                records.append(record_of(BACKGROUND, await send_request(http, "completions", SERVED_NAME, req), start))

        async def one_burst_request(length: int) -> None:
            req = ServeRequest(maker.make(length), args.burst_output_len, length)
            records.append(record_of(BURST, await send_request(http, "completions", SERVED_NAME, req), start))

        burst_times: list[float] = []
        tasks = [asyncio.create_task(background()) for _ in range(args.background_streams)]
        k = 1
        while interval is not None and start + k * interval < end:
            await asyncio.sleep(max(0.0, start + k * interval - time.perf_counter()))
            burst_times.append(time.perf_counter() - start)
            lengths = maker.rng.integers(burst_lens[0], burst_lens[1], size=args.burst_size, endpoint=True)
            tasks += [asyncio.create_task(one_burst_request(int(n))) for n in lengths]
            k += 1
        await asyncio.gather(*tasks)
    return records, burst_times


def warm_up(url: str, args: argparse.Namespace) -> None:
    """One short and one long request, so the first burst pays no one-time cost."""
    async def go() -> None:
        maker = PromptMaker("ids", np.random.default_rng(12345))
        long_len = parse_len_range(args.burst_input_len, "--burst-input-len")[1]
        async with httpx.AsyncClient(base_url=url, timeout=3600.0) as http:
            for length, out in ((args.background_input_len, 4), (long_len, 2)):
                outcome = await send_request(http, "completions", SERVED_NAME, ServeRequest(maker.make(length), out, length))
                if outcome.error:
                    raise RuntimeError(f"the warm-up request to {url} failed: {outcome.error}")
    asyncio.run(go())


def kv_transfer_counters(consumer_url: str) -> dict[str, float]:
    """The consumer's KV-transfer counters (pulls that arrived, their bytes and summed seconds)."""
    text = httpx.get(f"{consumer_url}/metrics", timeout=30.0).text
    wanted = {"kv_transfer_loads": "loads", "kv_transfer_recv_bytes": "bytes", "kv_transfer_recv_seconds": "seconds"}
    counters = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name.split(":", 1)[-1].removesuffix("_total"))
        if key is not None:
            counters[key] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return counters


def transfer_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    loads = after["loads"] - before["loads"]
    num_bytes, seconds = after["bytes"] - before["bytes"], after["seconds"] - before["seconds"]
    return {"transfers": int(loads), "total_mb": num_bytes / 2**20,
            "mean_mb": num_bytes / 2**20 / loads if loads else None,
            "mean_ms": seconds * 1000.0 / loads if loads else None}


def run_config(config: str, args: argparse.Namespace, logs: Path, intervals: list[float]) -> list[dict[str, Any]]:
    url, procs, consumer_url = launch(config, args, logs)
    runs = []
    own_cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        if config == "d" and args.front_cpus:
            os.sched_setaffinity(0, args.front_cpus)  # this client, beside the proxy
        warm_up(url, args)
        rounds = [(repeat, interval) for repeat in range(args.repeats) for interval in [None, *intervals]]
        for i, (repeat, interval) in enumerate(rounds):
            before = kv_transfer_counters(consumer_url) if consumer_url else None
            records, burst_times = asyncio.run(drive(url, args, interval, seed=args.seed + i))
            run = summarize_run(records, burst_times, args.duration, ttft_slo_ms=args.ttft_slo_ms,
                                itl_slo_ms=args.itl_slo_ms)
            run.update(config=CONFIGS[config], burst_interval_s=interval, repeat=repeat, repeats=args.repeats,
                       itl_over_time=itl_over_time(records, args.itl_window, run["duration_s"]),
                       kv_transfer=transfer_figures(before, kv_transfer_counters(consumer_url)) if before else None)
            print(f"{CONFIGS[config]}, bursts every {interval or 'never'} (repeat {repeat + 1} of {args.repeats}): "
                  f"{run['requests']} requests, {run['failed']} failed", flush=True)
            runs.append(run)
    finally:
        if config == "d" and args.front_cpus:
            os.sched_setaffinity(0, own_cpus)
        for p in reversed(procs):
            p.stop()
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL",
                        help="as `folovllm serve MODEL` (default: the engine's default model)")
    parser.add_argument("--configs", default="a,b", help="of a,b,c,d (see above)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per run")
    parser.add_argument("--burst-intervals", default="3", metavar="S1,S2,...",
                        help="seconds between bursts; several: one run each (a sweep)")
    parser.add_argument("--burst-size", type=int, default=2, help="long prompts per burst")
    parser.add_argument("--burst-input-len", default="1024:2048", metavar="A:B", help="their prompt tokens")
    parser.add_argument("--burst-output-len", type=int, default=8)
    parser.add_argument("--background-streams", type=int, default=8)
    parser.add_argument("--background-input-len", type=int, default=32)
    parser.add_argument("--background-output-len", type=int, default=256)
    parser.add_argument("--ttft-slo-ms", type=float, default=5000.0, help="goodput: TTFT at most this")
    parser.add_argument("--itl-slo-ms", type=float, default=500.0, help="goodput: every inter-token gap at most this")
    parser.add_argument("--itl-window", type=float, default=0.5, help="seconds per point of the ITL plot")
    parser.add_argument("--pd-connector", default="torch_distributed", choices=["torch_distributed", "shared_storage"])
    parser.add_argument("--pd-front-cpus", default="", metavar="CPUS",
                        help="config d: pin the proxy and this client (the front end) to these cores, e.g. 0 "
                             "(beside the producer), so the consumer's core runs the consumer alone "
                             "(default: not pinned; the OS places them)")
    parser.add_argument("--pd-trace-dir", default="", metavar="DIR",
                        help="config d: the producer's and the consumer's step traces (serve --trace) go to "
                             "DIR/producer.jsonl and DIR/consumer.jsonl, for lining steps up with the bursts")
    parser.add_argument("--serve-args", default="", help="more `folovllm serve` flags for every server, quoted")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds a server may take to start")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of (no-burst run, one run per interval) per config, on the same servers; "
                             "each burst run is compared with its own round's no-burst run, and the table adds "
                             "the median ratio over the rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="docs/results/pd-burst.json", help="the JSON; the PNG goes beside it")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.configs.split(",")) - set(CONFIGS))
    if unknown:
        raise ValueError(f"--configs takes letters of {','.join(CONFIGS)}, got {unknown}.")
    try:
        args.intervals = [float(s) for s in args.burst_intervals.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--burst-intervals takes comma-separated seconds, got {args.burst_intervals!r}.") from None
    if not args.intervals or any(s <= 0 for s in args.intervals) or args.duration <= 0 or args.repeats < 1:
        raise ValueError("--burst-intervals, --duration and --repeats must be positive.")
    if "d" in args.configs.split(",") and (not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2):
        raise ValueError("config d pins its two instances to cores 0 and 1: it needs two usable cores.")
    try:
        args.front_cpus = {int(c) for c in args.pd_front_cpus.split(",") if c.strip()}
    except ValueError:
        raise ValueError(f"--pd-front-cpus takes comma-separated core numbers, got {args.pd_front_cpus!r}.") from None
    if args.front_cpus and not args.front_cpus <= os.sched_getaffinity(0):
        raise ValueError(f"--pd-front-cpus {args.pd_front_cpus}: this process may use only cores "
                         f"{sorted(os.sched_getaffinity(0))}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="pd-burst-logs-"))
    runs: list[dict[str, Any]] = []
    for config in args.configs.split(","):
        runs += run_config(config, args, logs, args.intervals)
    add_no_burst_ratios(runs)
    summary = median_ratios(runs)
    settings = {k: v for k, v in vars(args).items() if k not in ("intervals", "front_cpus")}
    output.write_text(json.dumps({"name": "pd-burst", "settings": settings, "runs": runs, "summary": summary},
                                 indent=2))
    plot_itl_timelines([r for r in runs if r["repeat"] == 0], output.with_suffix(".png"))
    print(markdown_table(runs))
    if args.repeats > 1:
        print(f"\nmedian over {args.repeats} repeats:\n{median_table(summary)}")
    print(f"wrote {output} and {output.with_suffix('.png')} (server logs in {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
