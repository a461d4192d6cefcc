"""Output tok/s through the HTTP server (concurrent streaming clients) vs the offline engine, same workload.

    .venv/bin/python scripts/http_vs_offline.py                 # 32 × 10-token prompts × 64 tokens, greedy
    .venv/bin/python scripts/http_vs_offline.py --num-requests 64 --output-len 128
    .venv/bin/python scripts/http_vs_offline.py --no-engine-process   # the engine on a server thread

The server runs in a subprocess (`folovllm serve`), the client here with httpx (raw SSE, so the
client's own parsing costs little); LLM.generate runs the same requests in this process while the
server idles (its engine core sleeps). The two alternate for --rounds rounds; the median of each counts,
which keeps a busy shared machine from skewing one side.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from folovllm import LLM, SamplingParams
from folovllm.bench.workloads import build_workload, special_token_ids

ENGINE_ARGS = {"max_model_len": 512, "kv_cache_memory": "512MiB", "seed": 0}


def _median_run(runs: list[tuple[int, float]]) -> tuple[int, float]:
    """The run with the median rate (tokens/s) among the rounds."""
    ordered = sorted(runs, key=lambda r: r[0] / r[1])
    return ordered[len(ordered) // 2]


async def _one(client: httpx.AsyncClient, prompt_ids: list[int], max_tokens: int) -> int:
    body = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    completion_tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith('data: {"id"') and '"usage"' in line:
                completion_tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return completion_tokens


async def _http_run(base_url: str, requests) -> tuple[int, float]:
    limits = httpx.Limits(max_connections=len(requests) + 1)
    async with httpx.AsyncClient(base_url=base_url, timeout=600.0, limits=limits) as client:
        await _one(client, requests[0].prompt_token_ids, 2)  # warm-up
        start = time.perf_counter()
        counts = await asyncio.gather(*(_one(client, r.prompt_token_ids, r.max_tokens) for r in requests))
        return sum(counts), time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "folovllm.entrypoints.cli", "serve", "--port", str(port),
           "--log-level", "warning", "--dtype", args.dtype]
    if not args.engine_process:
        cmd.append("--no-engine-process")
    for name, value in ENGINE_ARGS.items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                return proc, base_url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.3)


def _offline_run(llm: LLM, requests) -> tuple[int, float]:
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outputs), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=10)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads, both sides")
    parser.add_argument("--no-engine-process", dest="engine_process", action="store_false",
                        help="serve with the engine on a thread of the server process")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    if args.num_threads:
        ENGINE_ARGS["num_threads"] = args.num_threads

    llm = LLM(dtype=args.dtype, **ENGINE_ARGS)
    requests = build_workload("decode-heavy", llm.llm_engine.model.arch.vocab_size,
                              special_token_ids(llm.tokenizer), num_requests=args.num_requests,
                              input_len=args.input_len, output_len=args.output_len)
    llm.generate([requests[0].prompt_token_ids], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    proc, base_url = _start_server(args)
    http_runs, offline_runs = [], []
    try:
        for _ in range(args.rounds):
            http_runs.append(asyncio.run(_http_run(base_url, requests)))
            offline_runs.append(_offline_run(llm, requests))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    http_tokens, http_s = _median_run(http_runs)
    offline_tokens, offline_s = _median_run(offline_runs)
    print("per round (http, offline) tok/s: " + ", ".join(
        f"({h[0] / h[1]:.1f}, {o[0] / o[1]:.1f})" for h, o in zip(http_runs, offline_runs)))
    http_rate, offline_rate = http_tokens / http_s, offline_tokens / offline_s
    print(f"workload: {len(requests)} requests x {args.input_len}-token prompts x {args.output_len} "
          f"tokens, greedy, ignore_eos, dtype={args.dtype}, cpus={os.cpu_count()}")
    print(f"http    : {http_tokens} tokens in {http_s:.2f} s = {http_rate:.1f} output tok/s")
    print(f"offline : {offline_tokens} tokens in {offline_s:.2f} s = {offline_rate:.1f} output tok/s")
    print(f"server engine core: {'own process' if args.engine_process else 'server thread'}")
    print(f"ratio http/offline: {http_rate / offline_rate:.3f} (target >= 0.85)")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump([{"name": "http-vs-offline", "num_requests": len(requests), "input_len": args.input_len,
                        "output_len": args.output_len, "num_threads": args.num_threads or os.cpu_count(),
                        "engine_core": "process" if args.engine_process else "thread",
                        "rounds": args.rounds, "http_output_tok_s": http_rate,
                        "offline_output_tok_s": offline_rate, "ratio": http_rate / offline_rate}], f, indent=2)


if __name__ == "__main__":
    main()
