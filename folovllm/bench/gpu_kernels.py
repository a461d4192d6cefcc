"""Kernel-level figures of scripts/gpu_bench.py: a decode graph's kernels and replay time, and the Triton
attention kernels (prefill tiles, decode split over the context) against torch's SDPA on the same device."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from folovllm.sample.rows import SamplingRow
from folovllm.sampling_params import SamplingParams
from folovllm.worker.cuda_graphs import GREEDY, CudaGraphRunner
from folovllm.worker.step_input import ScheduledRequest


def _median_ms(fn: Callable[[], Any], iters: int, cuda: bool) -> float:
    """Median time of ``fn``: on CUDA each call between two events (device time), else wall time."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def _kernels(fn: Callable[[], Any], calls: int) -> tuple[float, list[dict[str, Any]]]:
    """Device kernels per call of ``fn`` under the profiler, and the kernels with the most device time."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
    top = sorted(rows, key=lambda e: e.self_device_time_total, reverse=True)[:8]
    return (sum(e.count for e in rows) / calls,
            [{"kernel": e.key[:80], "calls": e.count / calls, "us": e.self_device_time_total / calls} for e in top])


def decode_graph_figures(engine: Any, sizes: tuple[int, ...], iters: int = 50) -> dict[str, Any]:
    """At each batch size: the decode step the graph holds run eagerly (its kernels, its time) and, where graphs
    were captured, the replay (kernels per replay under the profiler, device ms per replay). Each row is a
    sequence of one token in a block of its own (the engine idle, its prefix cache emptied first, so no block
    holds anything kept), so attention reads one key: the figures are the step's fixed cost, the launches and
    the weights' reads. ``kernels_per_replay``: at the smallest size."""
    if engine.has_unfinished_requests():
        raise RuntimeError("the decode graph figures write KV blocks: run them on an idle engine")
    engine.reset_prefix_cache()
    runner = engine.worker.runner
    graphs: CudaGraphRunner | None = runner.cuda_graphs
    cuda = runner.platform.captures_graphs
    if graphs is None:  # no graphs here (CPU): a runner of the same step, never captured
        graphs = CudaGraphRunner(runner.model, runner.kv_caches, runner.block_size, engine.max_model_len,
                                 max(sizes), runner.platform)
    out: dict[str, Any] = {"captured": bool(graphs.graphs)}
    with torch.inference_mode():
        for size in sizes:
            size = graphs.padded_size(min(size, graphs.sizes[-1]))
            rows = [ScheduledRequest(str(i), [1], 0, 0, [i], SamplingRow(SamplingParams(temperature=0.0)))
                    for i in range(size)]
            graphs.inputs.stage(rows, [-1] * size, size, None)
            figures: dict[str, Any] = {"eager_step_ms": _median_ms(lambda: graphs.run_step(size, GREEDY), 10, cuda)}
            if cuda:
                figures["eager_step_kernels"], _ = _kernels(lambda: graphs.run_step(size, GREEDY), 1)
            graph = graphs.graphs.get((size, GREEDY))
            if graph is not None:
                figures["replay_ms"] = _median_ms(graph.replay, iters, cuda)
                figures["kernels_per_replay"], figures["top_kernels"] = _kernels(graph.replay, 5)
            out[f"batch_{size}"] = figures
    first = out[f"batch_{graphs.padded_size(min(sizes[0], graphs.sizes[-1]))}"]
    out["kernels_per_replay"] = first.get("kernels_per_replay") or first.get("eager_step_kernels")
    return out


def attention_figures(device: str, num_heads: int = 16, num_kv_heads: int = 8, head_dim: int = 128,
                      block_size: int = 16, iters: int = 20) -> dict[str, Any]:
    """Qwen3-0.6B's attention shape in bf16: a prefill-heavy step (16 fresh sequences of 1024 tokens) through the
    prefill kernel at its tiles and at 64-row ones, against SDPA (flash where torch picks it) on the same K/V;
    decode rows at 512 to 16k context, split over the context and not, against SDPA of one query."""
    from folovllm.attention import triton_kernels
    from folovllm.attention.triton_kernels import PrefillTiles, prefill_tiles

    dtype, scale = torch.bfloat16, head_dim**-0.5
    gen = torch.Generator(device=device).manual_seed(0)
    cuda = device.startswith("cuda")

    def paged(seqs: int, context: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """K/V of ``seqs`` sequences of ``context`` tokens in a paged cache (blocks in order), and its table."""
        blocks = -(-context // block_size)
        k = torch.randn(seqs, context, num_kv_heads, head_dim, generator=gen, device=device, dtype=dtype)
        v = torch.randn(seqs, context, num_kv_heads, head_dim, generator=gen, device=device, dtype=dtype)
        shape = (seqs * blocks, block_size, num_kv_heads, head_dim)
        k_cache = torch.zeros(shape, dtype=dtype, device=device)
        v_cache = torch.zeros(shape, dtype=dtype, device=device)
        k_cache.view(seqs, -1, num_kv_heads, head_dim)[:, :context] = k
        v_cache.view(seqs, -1, num_kv_heads, head_dim)[:, :context] = v
        tables = torch.arange(seqs * blocks, device=device).view(seqs, blocks)
        return k, v, (k_cache, v_cache), tables

    out: dict[str, Any] = {"shape": {"heads": num_heads, "kv_heads": num_kv_heads, "head_dim": head_dim}}
    seqs, length = 16, 1024
    k, v, (k_cache, v_cache), tables = paged(seqs, length)
    q = torch.randn(seqs * length, num_heads, head_dim, generator=gen, device=device, dtype=dtype)
    seq_lens = torch.full((seqs,), length, device=device)
    starts = torch.arange(0, (seqs + 1) * length, length, device=device)
    flops = 4 * seqs * num_heads * head_dim * length * length / 2  # causal: half the score matrix
    prefill: dict[str, Any] = {"sequences": seqs, "tokens": length}
    tile_choices = {"default": prefill_tiles(head_dim), "rows64": PrefillTiles(64, 64, 4, 3)}
    for name, tiles in tile_choices.items():
        ms = _median_ms(lambda: triton_kernels.paged_attention(q, k_cache, v_cache, tables, seq_lens, starts,
                                                                scale, tiles=tiles), iters, cuda)
        prefill[f"triton_{name}_ms"] = ms
        prefill[f"triton_{name}_tflops"] = flops / ms / 1e9
    q4 = q.view(seqs, length, num_heads, head_dim).transpose(1, 2)
    group = num_heads // num_kv_heads
    k4, v4 = (x.transpose(1, 2).repeat_interleave(group, dim=1) for x in (k, v))
    sdpa_ms = _median_ms(lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale), iters, cuda)
    prefill.update(sdpa_ms=sdpa_ms, sdpa_tflops=flops / sdpa_ms / 1e9,
                   triton_over_sdpa=prefill["triton_default_ms"] / sdpa_ms)
    out["prefill"] = prefill
    del k, v, k_cache, v_cache, q, q4, k4, v4

    decode: dict[str, Any] = {}
    for seqs, context in ((1, 512), (1, 4096), (1, 16384), (128, 512)):
        k, v, (k_cache, v_cache), tables = paged(seqs, context)
        q = torch.randn(seqs, num_heads, head_dim, generator=gen, device=device, dtype=dtype)
        seq_lens = torch.full((seqs,), context, device=device)
        starts = torch.arange(seqs + 1, device=device)
        row: dict[str, Any] = {}
        for name, splits in (("split", None), ("unsplit", 1)):
            row[f"{name}_ms"] = _median_ms(lambda: triton_kernels.paged_attention(
                q, k_cache, v_cache, tables, seq_lens, starts, scale, num_splits=splits), iters, cuda)
        q4 = q.view(seqs, num_heads, 1, head_dim)
        k4, v4 = (x.transpose(1, 2).repeat_interleave(group, dim=1) for x in (k, v))
        row["sdpa_ms"] = _median_ms(lambda: F.scaled_dot_product_attention(q4, k4, v4, scale=scale), iters, cuda)
        decode[f"batch_{seqs}_context_{context}"] = row
        del k, v, k_cache, v_cache
    out["decode"] = decode
    return out
