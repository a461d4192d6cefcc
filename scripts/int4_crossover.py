"""At which batch size M do the CPU int4 matmuls (torch's, ours) lose to the bf16 one, and would dequantizing win?

    .venv/bin/python scripts/int4_crossover.py --out docs/results/int4-crossover.json

For each linear shape of the default model (K -> N: q/k/v, o, gate/up, down) and each M, times in
alternating rounds in one process: torch's int4 kernel (groups of 64, as GPTQ g128 runs at K = 576 there),
ours (csrc/cpu_quant_gemm.cpp, the same weights as groups of 128 with a partial last one, as GPTQ g128
runs on it), the prepacked bf16 linear (the engine's unquantized path), and "dequantize then bf16": the layer's 4-bit codes
expanded to bf16 with torch ops into a reused buffer, then a plain bf16 linear (what a dispatch on M
would do above the crossover). Reports median microseconds per call and the crossover M per shape
(for torch's kernel, and for ours).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm.model.cpu_packed import pack_linear_weight, packed_linear  # noqa: E402
from folovllm.model.quant.cpu_quant import cpu_quant_unavailable  # noqa: E402
from folovllm.model.quant.kernels import int4_group_kernel  # noqa: E402

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
GROUP = 64  # what GPTQ g128 runs as on torch's kernel for K = 576 (not a multiple of 128; kernels._int4_tiling)
OUR_GROUP = 128  # ours takes the partial last group


def timed(fn: Callable[[], torch.Tensor], repeat: int) -> float:
    """Median microseconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    not_built = cpu_quant_unavailable()
    if not_built:
        print(f"our int4 kernel is left out: {not_built}")
    rows = {}
    for name, (k, n) in SHAPES.items():
        codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
        scales = torch.rand(n, k // GROUP, generator=gen) * 0.01
        zeros = torch.randn(n, k // GROUP, generator=gen) * 0.01
        int4 = int4_group_kernel(codes, scales, zeros, GROUP, torch.bfloat16, "torch")
        # groups of 128: pairs of the 64-groups, sharing the first one's scale and zero (same bytes per weight)
        ours = None if not_built else int4_group_kernel(codes, scales[:, ::2], zeros[:, ::2], OUR_GROUP,
                                                        torch.bfloat16, "folovllm")
        weight = ((codes.float() - 8) * scales.repeat_interleave(GROUP, 1)
                  + zeros.repeat_interleave(GROUP, 1)).to(torch.bfloat16)
        packed = pack_linear_weight(weight)
        # w = q s + (zero - 8 s): two passes over the reused buffer after the copy from uint8
        s = scales.to(torch.bfloat16)[..., None]
        z = (zeros - 8 * scales).to(torch.bfloat16)[..., None]
        buffer = torch.empty(n, k // GROUP, GROUP, dtype=torch.bfloat16)
        grouped = codes.view(n, k // GROUP, GROUP)

        def dequant_linear(x: torch.Tensor) -> torch.Tensor:
            buffer.copy_(grouped)
            buffer.mul_(s).add_(z)
            return F.linear(x, buffer.view(n, k))

        kinds = ["int4", "bf16", "dequant_bf16"] + ([] if not_built else ["ours"])
        times: dict[int, dict[str, list[float]]] = {m: {kind: [] for kind in kinds} for m in args.ms}
        for _ in range(args.rounds):
            for m in args.ms:
                x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
                times[m]["int4"].append(timed(lambda: int4(x), args.repeat))
                times[m]["bf16"].append(timed(lambda: packed_linear(x, packed, None), args.repeat))
                times[m]["dequant_bf16"].append(timed(lambda: dequant_linear(x), args.repeat))
                if ours is not None:
                    times[m]["ours"].append(timed(lambda: ours(x), args.repeat))
        medians = {m: {kind: statistics.median(v) for kind, v in t.items()} for m, t in times.items()}
        crossover = next((m for m in args.ms if medians[m]["int4"] > medians[m]["bf16"]), None)
        ours_crossover = None if ours is None else next(
            (m for m in args.ms if medians[m]["ours"] > medians[m]["bf16"]), None)
        rows[name] = {"k": k, "n": n, "crossover_m": crossover, "ours_crossover_m": ours_crossover,
                      "us": {str(m): v for m, v in medians.items()}}
        print(f"{name} ({k} -> {n}): torch's int4 slower than bf16 from M={crossover}, ours from M={ours_crossover}")
        for m, v in medians.items():
            print(f"    M={m:4d}  int4 {v['int4']:8.1f} us  ours {v.get('ours', float('nan')):8.1f} us  "
                  f"bf16 {v['bf16']:8.1f} us  dequant+bf16 {v['dequant_bf16']:8.1f} us")
    if args.out:
        args.out.write_text(json.dumps({"threads": torch.get_num_threads(), "group": GROUP, "shapes": rows},
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
