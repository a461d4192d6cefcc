"""How long /health takes to answer while one heavy request is being processed.

Starts a server (or uses --base-url), then for each heavy request polls /health every 10 ms while
the request runs and prints the slowest /health answer seen. The bar: under 100 ms for each.

    .venv/bin/python scripts/health_under_load.py [--base-url http://127.0.0.1:8000]
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx


def heavy_requests(max_body: int) -> list[tuple[str, str, dict]]:
    ids = [1000 + i % 9000 for i in range((max_body - 100) // 5)]  # "1234," a token: just under the limit
    return [
        ("body of token ids at the size limit", "/v1/completions", {"prompt": ids, "max_tokens": 1}),
        ("a text at the size limit to /tokenize", "/tokenize", {"prompt": "hello " * ((max_body - 100) // 6)}),
        ("a text that just fits the context", "/tokenize", {"prompt": "hello " * 2000}),
        ("64 stop strings of 1000 chars, 200 tokens", "/v1/completions",
         {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True,
          "stop": [f"{i:03d}" + "z" * 997 for i in range(64)]}),
        ("n=128", "/v1/completions", {"prompt": "Hi", "max_tokens": 4, "n": 128}),
        ("a chat of 1,000 short messages", "/v1/chat/completions",
         {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(1000)],
          "max_tokens": 1}),
    ]


def probe(base_url: str, path: str, body: dict) -> tuple[float, int, int]:
    """(slowest /health in ms, /health calls, status of the heavy request)."""
    latencies: list[float] = []
    status: list[int] = []

    def send() -> None:
        with httpx.Client(timeout=600) as client:
            with client.stream("POST", base_url + path, content=json.dumps(body, separators=(",", ":")),
                               headers={"Content-Type": "application/json"}) as response:
                for _ in response.iter_bytes():
                    pass
                status.append(response.status_code)

    worker = threading.Thread(target=send)
    with httpx.Client(timeout=30) as client:
        worker.start()
        while worker.is_alive():
            start = time.perf_counter()
            client.get(base_url + "/health")
            latencies.append((time.perf_counter() - start) * 1e3)
            time.sleep(0.01)
    worker.join()
    return max(latencies), len(latencies), status[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="a running server (default: start one)")
    parser.add_argument("--max-request-body-bytes", type=int, default=2**20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = None
    base_url = args.base_url
    if base_url is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "folovllm.entrypoints.cli", "serve", "--port",
                                   str(port), "--log-level", "error", "--max-model-len", "8192",
                                   "--max-request-body-bytes", str(args.max_request_body_bytes)])
        base_url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    try:
        print(f"{'heavy request':45s} {'status':>6s} {'/health max ms (median of rounds)':>34s}")
        for name, path, body in heavy_requests(args.max_request_body_bytes):
            runs = [probe(base_url, path, body) for _ in range(args.rounds)]
            print(f"{name:45s} {runs[0][2]:>6d} {statistics.median(r[0] for r in runs):>34.1f}")
    finally:
        if server is not None:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
