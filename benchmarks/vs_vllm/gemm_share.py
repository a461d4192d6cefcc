"""How much of the host's GEMM limit each engine's offline run reached.

A run's arithmetic is the model's for its requests: every linear over every token it computes (the prompt,
then each generated token but the last, which is never fed back), causal attention over those tokens, and
one row of logits per generated token. That over the run's wall time, against the fastest large GEMM torch
runs here (``folovllm bench kernel``'s limit: MKL's and oneDNN's, fp32 and bf16, best of five), says how
close an engine comes to what the cores do; the same arithmetic serves both engines.
"""
from __future__ import annotations

import statistics
from typing import Any

from folovllm.simulator.roofline import ModelShape


def request_flops(shape: ModelShape, prompt_len: int, output_len: int) -> float:
    """FLOPs of one request of ``prompt_len`` tokens generating ``output_len``."""
    tokens = prompt_len + output_len - 1
    return shape.flops(tokens, output_len, tokens * (tokens + 1) // 2)


def workload_flops(shape: ModelShape, requests: list[dict[str, Any]]) -> float:
    return sum(request_flops(shape, len(r["prompt_token_ids"]), r["max_tokens"]) for r in requests)


def shares(shape: ModelShape, offline: dict[str, Any], requests: dict[str, list[dict[str, Any]]],
           limit_gflop_s: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per workload and engine: the GFLOP/s of its median run and that over the limit."""
    found: dict[str, dict[str, dict[str, float]]] = {}
    for wl in offline["workloads"]:
        flops = workload_flops(shape, requests[wl["name"]])
        for engine, runs in wl["runs"].items():
            wall = statistics.median(r["wall_s"] for r in runs)
            gflop_s = flops / wall / 1e9
            found.setdefault(wl["name"], {})[engine] = {"gflop_s": gflop_s, "share": gflop_s / limit_gflop_s}
    return found
