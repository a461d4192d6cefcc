"""Engine knobs on the command line, shared by every subcommand (named as in vLLM's CLI)."""
from __future__ import annotations

import argparse
import dataclasses

from folovllm.config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Engine knobs shared by every subcommand, named as in vLLM's CLI."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="a .gguf file or HF folder (default: SmolLM2-135M-Instruct)")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device", default="auto")
    g.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-cache-memory", default=None, help="CPU KV cache size, e.g. 2GiB (default)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    g.add_argument("--long-prefill-token-threshold", type=int, default=0,
                   help="cap each prompt's chunk per step so short requests can join (0 = off)")
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="turn automatic prefix caching off (ablation)")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"],
                   help="auto: triton on CUDA, torch elsewhere")
    g.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs for decode steps")
    g.add_argument("--cuda-graph-max-batch", type=int, default=256,
                   help="CUDA: the largest decode batch captured in a CUDA graph")
    g.add_argument("--no-overlap", dest="overlap_scheduling", action="store_const", const=False,
                   default="auto", help="do not schedule step N+1 while the device runs step N "
                                        "(default: overlap on CUDA, where the device runs asynchronously)")
    g.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority", "sjf", "fair"])
    g.add_argument("--max-queue-delay", type=float, default=None,
                   help="sjf/fair: seconds after which a waiting request goes first (aging)")
    g.add_argument("--admission", default="on-demand", choices=["on-demand", "reserve", "adaptive"],
                   help="on-demand (vLLM), reserve prompt+max_tokens (TGI), adaptive reservation (SGLang)")
    g.add_argument("--max-batch-total-tokens", type=int, default=None)
    g.add_argument("--max-batch-prefill-tokens", type=int, default=None)
    g.add_argument("--waiting-served-ratio", type=float, default=0.3)
    g.add_argument("--max-waiting-tokens", type=int, default=20)
    g.add_argument("--adaptive-init-beta", type=float, default=0.7)
    g.add_argument("--scheduling", default="continuous", choices=["continuous", "static"],
                   help="static: batch-level static batching (ablation)")
    g.add_argument("--kv-layout", default="paged", choices=["paged", "contiguous"],
                   help="contiguous: each request reserves max_model_len up front (ablation)")
    g.add_argument("--trace", dest="trace_path", default=None,
                   help="write the step trace (JSONL: tokens by kind, running, waiting, KV) here")
    g.add_argument("--num-threads", type=int, default=None, help="CPU threads for torch (default: all cores)")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Every EngineConfig field that the parsed arguments carry."""
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    return EngineConfig(**{k: v for k, v in vars(args).items() if k in names})
