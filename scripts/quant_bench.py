"""Quantized weights on the CPU: decode speed and weight bytes of the default model, bf16 vs GPTQ vs INT8.

    .venv/bin/python scripts/quant_bench.py --rounds 5 --out docs/results/quant-cpu.json

Writes a GPTQ checkpoint of the default model (its GGUF weights, dequantized, then round-to-nearest
4-bit, groups of 128, symmetric, v1 format; and 8-bit the same way), loads the GGUF file itself with
its Q4_1 weights kept 4-bit (``--load-quantized on``), each quantized variant with its LM head in
bf16 (``--quantize-lm-head off``) and, for the 4-bit ones and INT8, also in int8 (``-int8head``:
the engine's ``auto`` for quantized models); 4-bit linears run our int4 kernel where it is built
(``FOLOVLLM_QUANT_KERNEL=auto``), and ``-torchkernel`` variants run torch's; ``-a8`` variants round the
activations of those int4 matmuls to int8 (``FOLOVLLM_INT4_ACTIVATIONS=int8``, AVX512_VNNI), ``-a8auto`` only
in calls of 16 rows or more (``auto``: batch 64 and prefill, not one stream). The ``-unfused`` variant calls
each layer's int4 MLP as three ops (``FOLOVLLM_INT4_FUSED_MLP=off``) instead of one. Then it times every variant in
alternating rounds in this one process: a decode step (forward + logits) of one stream and of a batch
of 64 streams, each at a 64-token context, and a 256-token prefill. Reported: median tok/s per variant,
its ratio to bf16's median (and each round's ratio to bf16 in that round), and weight MiB (all and linear layers). The models run as the engine runs them on
CPU: the CPU attention kernel, the fused ops and, for bf16 linears, the bf16 linear kernel (``bf16-onednn``
is bf16 on oneDNN's prepacked linears instead); ``--no-engine-cpu-ops`` runs torch attention, unfused
ops and oneDNN. The ``-modules`` variants run their decoder layers through the ``nn.Module`` calls
(``FOLOVLLM_DIRECT_CALLS=off``) instead of the direct op calls (``model/direct.py``) the others use; the
``-nochain`` variants make those direct calls from Python (``FOLOVLLM_CPU_LAYER_CHAIN=off``) instead of the
one C++ call per step (``model/layer_chain.py``) the others make for decode steps; the ``-noteam`` variants
keep their one-stream steps on the chain's op calls (``FOLOVLLM_CPU_CHAIN_TEAM=off``) instead of the one team
of threads the chain runs a small int4 step on. The ``-smallpages``
variants leave their weights where loading put them, on 4 KiB pages (``FOLOVLLM_HUGE_PAGE_WEIGHTS=off``),
instead of in one block on 2 MiB pages (``model/huge_pages.py``).
The ``-actorder`` variant is a GPTQ act-order checkpoint (what ``folovllm quantize`` writes by default): each
int4 matmul first gathers its input's columns in the checkpoint's order.
``--only NAME ...`` times a subset beside bf16.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm.model.linear import LinearBase  # noqa: E402
from folovllm.model.layers import CausalLM  # noqa: E402
from folovllm.kernel_libraries import CPU_BF16_LINEAR_LIBRARY, cpu_bf16_linear_available  # noqa: E402
from folovllm.model.loader import default_model_path, load_model  # noqa: E402
from folovllm.model.quant.gptq_config import INT4_ACTIVATIONS_ENV, INT4_FUSED_MLP_ENV, KERNEL_ENV  # noqa: E402
from folovllm.model.direct import DIRECT_CALLS_ENV  # noqa: E402
from folovllm.model.layer_chain import CHAIN_TEAM_ENV, LAYER_CHAIN_ENV  # noqa: E402
from folovllm.model.huge_pages import HUGE_PAGE_WEIGHTS_ENV  # noqa: E402
from tests.helpers import make_attn_metadata  # noqa: E402
from folovllm.quantize.run import QuantizeArgs, quantize  # noqa: E402


def write_gptq_folder(folder: Path, bits: int, group_size: int, act_order: bool = False) -> str:
    """The default model as a GPTQ checkpoint folder, written by ``folovllm quantize --method rtn``; with
    ``act_order``, by GPTQ (asymmetric, act-order: ``quantize``'s defaults) on a short calibration (4 x 128
    tokens, no range search), which is enough for speed: only the layout (g_idx) matters there."""
    if act_order:
        quantize(QuantizeArgs(out=str(folder), method="gptq", bits=bits, group_size=group_size, act_order=True,
                              num_samples=4, seq_len=128, clip="off"))
    else:
        quantize(QuantizeArgs(out=str(folder), method="rtn", bits=bits, group_size=group_size, sym=True))
    return str(folder)


def weight_mib(model: CausalLM) -> tuple[float, float]:
    """(all weights, linear layers only) in MiB, as the model holds them."""
    linear = {id(t): t for m in model.modules() if isinstance(m, LinearBase) and m is not model.lm_head
              for t in (*m.parameters(), *m.buffers())}
    return model.weight_bytes() / 2**20, sum(t.numel() * t.element_size() for t in linear.values()) / 2**20


class StepTimer:
    """Times one model's steps on a paged cache: ``streams`` sequences at a fixed context."""

    BLOCK = 16

    def __init__(self, model: CausalLM, max_tokens: int, streams: int) -> None:
        arch = model.arch
        self.model, self.streams = model, streams
        blocks_per_seq = -(-max_tokens // self.BLOCK)
        shape = (streams * blocks_per_seq, self.BLOCK, arch.num_key_value_heads, arch.head_dim)
        self.caches = [(torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype))
                       for _ in range(arch.num_hidden_layers)]
        self.tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(streams)]

    @torch.inference_mode()
    def seconds(self, query_len: int, context: int) -> float:
        """Wall time of one step adding ``query_len`` tokens to each stream, ending at ``context`` tokens."""
        n = self.streams
        meta = make_attn_metadata([query_len] * n, [context] * n, self.tables, self.BLOCK)
        ids = torch.randint(10, 1000, (n * query_len,))
        positions = torch.arange(context - query_len, context).repeat(n)
        start = time.perf_counter()
        hidden = self.model(ids, positions, self.caches, meta)
        self.model.compute_logits(hidden[meta.query_start_loc[1:] - 1])
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15, help="decode steps timed per round (median kept)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", nargs="+", default=None, help="variants to time beside bf16 (default: all)")
    parser.add_argument("--engine-cpu-ops", action=argparse.BooleanOptionalAction, default=True,
                        help="every variant with the CPU attention kernel, the fused CPU ops and the bf16 linear "
                             "kernel (for its bf16 layers), as the engine runs them by default on CPU; "
                             "--no-engine-cpu-ops: torch attention, unfused ops, oneDNN bf16 linears")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tmp = Path(tempfile.mkdtemp(prefix="quant-bench-"))
    gguf, gptq4 = default_model_path(), write_gptq_folder(tmp / "gptq4", 4, 128)
    variants = {  # name: (path, quantization, load_quantized, quantize_lm_head, FOLOVLLM_QUANT_KERNEL)
        "bf16": (gguf, "auto", False, "off", "auto"),  # the engine's default CPU path
        "bf16-modules": (gguf, "auto", False, "off", "auto"),  # FOLOVLLM_DIRECT_CALLS=off
        "bf16-nochain": (gguf, "auto", False, "off", "auto"),  # FOLOVLLM_CPU_LAYER_CHAIN=off
        "bf16-noteam": (gguf, "auto", False, "off", "auto"),  # FOLOVLLM_CPU_CHAIN_TEAM=off
        "bf16-smallpages": (gguf, "auto", False, "off", "auto"),  # FOLOVLLM_HUGE_PAGE_WEIGHTS=off
        "bf16-onednn": (gguf, "auto", False, "off", "auto"),  # bf16 linears on oneDNN (--no-cpu-bf16-linear)
        "gptq-4bit-g128": (gptq4, "auto", False, "off", "auto"),
        "gptq-4bit-g128-int8head": (gptq4, "auto", False, "on", "auto"),
        "gptq-4bit-g128-int8head-modules": (gptq4, "auto", False, "on", "auto"),  # FOLOVLLM_DIRECT_CALLS=off
        "gptq-4bit-g128-int8head-nochain": (gptq4, "auto", False, "on", "auto"),  # FOLOVLLM_CPU_LAYER_CHAIN=off
        "gptq-4bit-g128-int8head-noteam": (gptq4, "auto", False, "on", "auto"),  # FOLOVLLM_CPU_CHAIN_TEAM=off
        "gptq-4bit-g128-int8head-smallpages": (gptq4, "auto", False, "on", "auto"),  # FOLOVLLM_HUGE_PAGE_WEIGHTS=off
        "gptq-4bit-g128-int8head-a8": (gptq4, "auto", False, "on", "auto"),  # FOLOVLLM_INT4_ACTIVATIONS=int8
        "gptq-4bit-g128-int8head-a8auto": (gptq4, "auto", False, "on", "auto"),  # FOLOVLLM_INT4_ACTIVATIONS=auto
        "gptq-4bit-g128-int8head-unfused": (gptq4, "auto", False, "on", "auto"),  # FOLOVLLM_INT4_FUSED_MLP=off
        "gptq-4bit-g128-int8head-torchkernel": (gptq4, "auto", False, "on", "torch"),
        "gptq-4bit-g128-actorder-int8head": (lambda: write_gptq_folder(tmp / "gptq4ao", 4, 128, act_order=True),
                                             "auto", False, "on", "auto"),
        "gptq-8bit-g128": (lambda: write_gptq_folder(tmp / "gptq8", 8, 128), "auto", False, "off", "auto"),
        "int8": (gguf, "int8", False, "off", "auto"),
        "int8-int8head": (gguf, "int8", False, "on", "auto"),
        "gguf-q4-packed": (gguf, "auto", True, "off", "auto"),  # --load-quantized on: the file's Q4_1 kept 4-bit
        "gguf-q4-packed-int8head": (gguf, "auto", True, "on", "auto"),
        "gguf-q4-packed-int8head-torchkernel": (gguf, "auto", True, "on", "torch"),
    }
    if args.only:
        variants = {name: v for name, v in variants.items() if name == "bf16" or name in args.only}
    engine_ops = {"attn_backend": "cpu", "cpu_fused_ops": True,
                  "cpu_bf16_linear": cpu_bf16_linear_available(CPU_BF16_LINEAR_LIBRARY)} if args.engine_cpu_ops else {}
    models = {name: load_variant(path() if callable(path) else path, q, packed, head, kernel,
                                 direct_calls="off" if name.endswith("-modules") else "on",
                                 layer_chain="off" if name.endswith("-nochain") else "on",
                                 chain_team="off" if name.endswith("-noteam") else "on",
                                 huge_pages="off" if name.endswith("-smallpages") else "on",
                                 int4_activations={"a8": "int8", "a8auto": "auto"}.get(name.rsplit("-", 1)[-1], "bf16"),
                                 fused_mlp="off" if name.endswith("-unfused") else "on",
                                 **(engine_ops | ({"cpu_bf16_linear": False} if name == "bf16-onednn" else {})))
              for name, (path, q, packed, head, kernel) in variants.items()}
    max_tokens = max(args.context, args.prefill)
    timers = {name: (StepTimer(m, max_tokens, 1), StepTimer(m, max_tokens, args.batch)) for name, m in models.items()}
    kinds = {"one_stream": lambda one, many: 1 / median_of(args.steps, lambda: one.seconds(1, args.context)),
             "batch": lambda one, many: args.batch / median_of(args.steps, lambda: many.seconds(1, args.context)),
             "prefill": lambda one, many: args.prefill / median_of(1, lambda: one.seconds(args.prefill, args.prefill))}
    for one, many in timers.values():  # warm-up
        one.seconds(1, args.context), many.seconds(1, args.context), one.seconds(args.prefill, args.prefill)
    rates: dict[str, dict[str, list[float]]] = {name: {k: [] for k in kinds} for name in models}
    for r in range(args.rounds):
        for name, (one, many) in timers.items():  # alternating: each round times every variant once
            for kind, rate in kinds.items():
                rates[name][kind].append(rate(one, many))
        print(f"round {r + 1}: " + ", ".join(
            f"{n} {rates[n]['one_stream'][-1]:.1f}/{rates[n]['batch'][-1]:.0f}/{rates[n]['prefill'][-1]:.0f}"
            for n in models), flush=True)

    result = {"threads": torch.get_num_threads(), "load_average": list(os.getloadavg()), "rounds": args.rounds,
              "engine_cpu_ops": args.engine_cpu_ops,
              "batch": args.batch, "context": args.context, "prefill": args.prefill, "variants": {}}
    base = {kind: statistics.median(rates["bf16"][kind]) for kind in kinds}
    base_all, base_linear = weight_mib(models["bf16"])
    for name, model in models.items():
        all_mib, linear_mib = weight_mib(model)
        entry = {"weight_mib": all_mib, "weight_drop": 1 - all_mib / base_all,
                 "linear_mib": linear_mib, "linear_drop": 1 - linear_mib / base_linear}
        for kind in kinds:
            med = statistics.median(rates[name][kind])
            entry[f"{kind}_tok_s"], entry[f"{kind}_ratio"] = med, med / base[kind]
            entry[f"{kind}_spread"] = [min(rates[name][kind]), max(rates[name][kind])]
            # each round's ratio to bf16's in the same round: how much of the ratio is the machine's drift
            entry[f"{kind}_round_ratios"] = [r / b for r, b in zip(rates[name][kind], rates["bf16"][kind])]
        result["variants"][name] = entry
        print(f"{name:15s} one stream {entry['one_stream_tok_s']:6.1f} tok/s ({entry['one_stream_ratio']:4.2f}x)  "
              f"batch {args.batch} {entry['batch_tok_s']:6.0f} ({entry['batch_ratio']:4.2f}x)  "
              f"prefill {entry['prefill_tok_s']:6.0f} ({entry['prefill_ratio']:4.2f}x)  "
              f"weights {all_mib:6.1f} MiB (-{entry['weight_drop']:.0%}), linears {linear_mib:6.1f} MiB "
              f"(-{entry['linear_drop']:.0%})")
        print(f"{'':15s} one stream per round: " + " ".join(f"{r:.2f}x" for r in entry["one_stream_round_ratios"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


def load_variant(path: str, quantization: str, load_quantized: bool, quantize_lm_head: str,
                 quant_kernel: str, direct_calls: str = "on", int4_activations: str = "bf16", fused_mlp: str = "on",
                 layer_chain: str = "on", huge_pages: str = "on", chain_team: str = "on",
                 **engine_ops: Any) -> CausalLM:
    """The bf16 model as a variant loads it, with ``FOLOVLLM_QUANT_KERNEL``, ``FOLOVLLM_DIRECT_CALLS``,
    ``FOLOVLLM_INT4_ACTIVATIONS``, ``FOLOVLLM_INT4_FUSED_MLP``, ``FOLOVLLM_CPU_LAYER_CHAIN``,
    ``FOLOVLLM_CPU_CHAIN_TEAM`` and ``FOLOVLLM_HUGE_PAGE_WEIGHTS`` set while its kernels, its layers' calls and its weights' memory are picked."""
    settings = {KERNEL_ENV: quant_kernel, DIRECT_CALLS_ENV: direct_calls, INT4_ACTIVATIONS_ENV: int4_activations,
                INT4_FUSED_MLP_ENV: fused_mlp, LAYER_CHAIN_ENV: layer_chain, HUGE_PAGE_WEIGHTS_ENV: huge_pages,
                CHAIN_TEAM_ENV: chain_team}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        return load_model(path, quantization=quantization, dtype=torch.bfloat16, device="cpu", cpu_prepack=True,
                          load_quantized=load_quantized, quantize_lm_head=quantize_lm_head, **engine_ops)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def median_of(count: int, step) -> float:
    """The median of ``count`` timed steps (seconds)."""
    return statistics.median(step() for _ in range(count))


if __name__ == "__main__":
    main()
