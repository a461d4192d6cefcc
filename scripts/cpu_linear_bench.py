"""CPU fast path, measured in one process: model steps with prepacked linear weights vs plain ones.

Loads the model twice (``cpu_prepack`` on and off), then times, in alternating rounds, one decode
step at batch 1 and at batch 64 and one prefill step, each with the logits of the sampled rows, and
prints medians and the plain/packed ratio. A packed-GEMM micro-benchmark (bf16, M=2048, K=576,
N=1536) gives this CPU's bf16 GEMM limit, and the prefill's linear layers are put against it.

    .venv/bin/python scripts/cpu_linear_bench.py                    # default model, bf16, all cores
    .venv/bin/python scripts/cpu_linear_bench.py --rounds 9 --threads 1 --prefill-tokens 1024
    .venv/bin/python scripts/cpu_linear_bench.py --output-json docs/results/cpu-fast-path.json
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from folovllm.attention.metadata import AttentionMetadata  # noqa: E402
from folovllm.config import usable_cores  # noqa: E402
from folovllm.model.cpu_packed import pack_linear_weight, packed_linear  # noqa: E402
from folovllm.model.layers import CausalLM  # noqa: E402
from folovllm.model.loader import default_model_path, load_model  # noqa: E402
from folovllm.paging import blocks_for_tokens  # noqa: E402

BLOCK_SIZE = 16


def step_inputs(query_lens: list[int], seq_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Token ids, positions and metadata of one ragged step; sequence i owns a contiguous run of blocks."""
    ids, positions, slots, tables, starts = [], [], [], [], [0]
    first_block = 0
    for q_len, s_len in zip(query_lens, seq_lens):
        table = list(range(first_block, first_block + blocks_for_tokens(s_len, BLOCK_SIZE)))
        first_block += len(table)
        for pos in range(s_len - q_len, s_len):
            ids.append(100 + pos % 1000)
            positions.append(pos)
            slots.append(table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
        tables.append(table)
        starts.append(starts[-1] + q_len)
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor(seq_lens), block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        query_lens=list(query_lens), seq_lens_list=list(seq_lens), block_size=BLOCK_SIZE)
    return torch.tensor(ids), torch.tensor(positions), meta


def make_step(model: CausalLM, query_lens: list[int], seq_lens: list[int]) -> Callable[[], torch.Tensor]:
    """One engine-like step: the forward, then logits of each sequence's last row."""
    arch = model.arch
    num_blocks = sum(blocks_for_tokens(s, BLOCK_SIZE) for s in seq_lens)
    shape = (num_blocks, BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim)
    caches = [(torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype))
              for _ in range(arch.num_hidden_layers)]
    ids, positions, meta = step_inputs(query_lens, seq_lens)
    last_rows = torch.tensor(query_lens).cumsum(0) - 1

    def step() -> torch.Tensor:
        with torch.inference_mode():
            hidden = model(ids, positions, caches, meta)
            return model.compute_logits(hidden[last_rows])

    return step


def seconds(fn: Callable[[], object], reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def alternate(cases: dict[str, Callable[[], object]], rounds: int, reps: int) -> dict[str, list[float]]:
    """Each round times every case once, in an order that flips each round (drift hits both)."""
    for fn in cases.values():
        fn()  # warm-up: oneDNN primitives, allocator
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(seconds(cases[name], reps))
    return times


def gemm_limit(m: int, k: int, n: int, rounds: int) -> dict[str, float]:
    """GFLOP/s of one bf16 linear [m x k] @ [k x n], packed and plain (best of rounds: the reachable limit)."""
    x = torch.randn(m, k, dtype=torch.bfloat16)
    packed = pack_linear_weight(torch.randn(n, k, dtype=torch.bfloat16) * 0.02)
    plain = torch.randn(n, k, dtype=torch.bfloat16) * 0.02
    times = alternate({"packed": lambda: packed_linear(x, packed, None), "plain": lambda: F.linear(x, plain)},
                      rounds, 3)
    gflops = {name: 2 * m * k * n / min(values) / 1e9 for name, values in times.items()}
    for name, values in times.items():
        print(f"  {name:<7} bf16 linear M={m} K={k} N={n}: median {statistics.median(values) * 1e3:7.2f} ms, "
              f"best {gflops[name]:6.0f} GFLOP/s")
    return gflops


class OpCounter(TorchDispatchMode):
    """Counts the aten ops Python dispatches (what each costs a fixed host overhead), by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def aten_ops_per_step(model: CausalLM, context: int) -> int:
    """Aten ops of one batch-1 decode step (forward + logits)."""
    step = make_step(model, [1], [context])
    with OpCounter() as counter:
        step()
    return sum(counter.counts.values())


def linear_flops_per_token(model: CausalLM) -> int:
    """FLOPs of every linear layer for one token (2 per multiply-add), the LM head excluded."""
    macs = sum(p.shape[0] * p.shape[1] for name, p in model.named_parameters()
               if name.endswith("proj.weight"))
    return 2 * macs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the shipped SmolLM2-135M GGUF")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--context", type=int, default=256, help="tokens each decoding sequence has cached")
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--output-json", default=None, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    path = args.model or default_model_path()

    result: dict = {"dtype": args.dtype, "threads": args.threads, "rounds": args.rounds, "context": args.context,
                    "prefill_tokens": args.prefill_tokens, "load_s": {}, "weight_mib": {}, "steps": {}}
    models = {}
    for prepack in (True, False):
        start = time.perf_counter()
        models[prepack] = load_model(path, dtype=dtype, device="cpu", cpu_prepack=prepack)
        key = "packed" if prepack else "plain"
        result["load_s"][key] = time.perf_counter() - start
        result["weight_mib"][key] = models[prepack].weight_bytes() / 2**20
        print(f"load (cpu_prepack={prepack}): {result['load_s'][key]:.2f} s, {result['weight_mib'][key]:.1f} MiB")
    ops = aten_ops_per_step(models[True], args.context)
    layers = models[True].arch.num_hidden_layers
    result.update(aten_ops_per_step=ops, aten_ops_per_layer=ops / layers)
    print(f"batch-1 decode step: {ops} aten ops ({ops / layers:.1f} per layer)")
    print(f"{args.dtype}, {args.threads} threads, {args.rounds} alternating rounds; medians")

    scenarios = {
        "decode b=1": ([1], [args.context], 20),
        "decode b=64": ([1] * 64, [args.context] * 64, 5),
        f"prefill {args.prefill_tokens}": ([args.prefill_tokens], [args.prefill_tokens], 1),
    }
    prefill_s = 0.0
    for name, (query_lens, seq_lens, reps) in scenarios.items():
        steps = {"packed": make_step(models[True], query_lens, seq_lens),
                 "plain": make_step(models[False], query_lens, seq_lens)}
        same = torch.equal(steps["packed"](), steps["plain"]())
        times = alternate(steps, args.rounds, reps)
        packed, plain = statistics.median(times["packed"]), statistics.median(times["plain"])
        spread = max(times["packed"]) / min(times["packed"])
        print(f"{name:<14} packed {packed * 1e3:8.2f} ms  plain {plain * 1e3:8.2f} ms  "
              f"plain/packed {plain / packed:4.2f}x  (packed max/min {spread:4.2f}; logits equal: {same})")
        result["steps"][name] = {"packed_ms": packed * 1e3, "plain_ms": plain * 1e3, "ratio": plain / packed,
                                 "packed_max_over_min": spread, "logits_equal": same}
        if name.startswith("prefill"):
            prefill_s = packed

    print("GEMM limit:")
    gemm = gemm_limit(2048, 576, 1536, args.rounds)
    limit, tokens = gemm["packed"], args.prefill_tokens
    reached = linear_flops_per_token(models[True]) * tokens / prefill_s / 1e9
    print(f"prefill {tokens}: the linear layers' FLOPs over the whole step time = {reached:.0f} GFLOP/s, "
          f"{reached / limit:.0%} of the packed GEMM limit ({limit:.0f} GFLOP/s)")
    result.update(gemm_gflops=gemm, prefill_linear_gflops=reached, prefill_fraction_of_limit=reached / limit)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
