"""``folovllm simulate run | calibrate | sweep``: options and what each subcommand does."""
from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from folovllm.bench.results import write_results
from folovllm.bench.serve_results import (
    format_serve_result,
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
)
from folovllm.bench.serve_workload import add_workload_args
from folovllm.config import EngineConfig
from folovllm.simulator.cluster import ClusterSpec
from folovllm.simulator.results import simulated_result
from folovllm.simulator.roofline import DEVICES
from folovllm.simulator.router import ROUTERS
from folovllm.simulator.run import simulate
from folovllm.simulator.setup import RooflineOptions, SimSetup, resolve_cost
from folovllm.simulator.workload import build_sim_requests

# The engine settings a simulation reads (their flags come from EngineConfig, as for serve).
SCHEDULER_FIELDS = ("block_size", "enable_prefix_caching", "max_num_seqs", "max_num_batched_tokens",
                    "enable_chunked_prefill", "long_prefill_token_threshold", "scheduling_policy", "max_model_len",
                    "max_queue_delay", "admission", "max_batch_total_tokens", "max_batch_prefill_tokens",
                    "waiting_served_ratio", "max_waiting_tokens", "adaptive_init_beta", "scheduling", "kv_layout",
                    "gpu_memory_utilization")


def _pd(text: str) -> tuple[int, int]:
    p, sep, d = text.partition(":")
    try:
        return int(p), int(d)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pd takes P:D replica counts, e.g. 2:6; got {text!r}") from None


def add_deployment_args(parser: argparse.ArgumentParser) -> None:
    """The cost profile and the cluster's shape (run and sweep)."""
    c = parser.add_argument_group("cost model")
    c.add_argument("--profile", required=True,
                   help=f"roofline:DEVICE ({', '.join(DEVICES)}), a shipped profile's name, or a profile JSON "
                        "from `simulate calibrate`")
    c.add_argument("--model-config", default=None,
                   help="roofline: the model's config.json (or its folder), or Qwen3-0.6B")
    c.add_argument("--tensor-parallel-size", "-tp", dest="tp", type=int, default=1,
                   help="roofline: GPUs per replica (FLOPs and bytes split, two all-reduces per layer)")
    c.add_argument("--compute-efficiency", type=float, default=0.5, help="roofline: share of peak FLOP/s reached")
    c.add_argument("--bandwidth-efficiency", type=float, default=0.7, help="roofline: share of peak HBM bandwidth")
    c.add_argument("--step-overhead-ms", type=float, default=2.0,
                   help="roofline: fixed host time per step (scheduling, input preparation, launches)")
    c.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV blocks per replica (default: the profile's, or what fits the GPU's memory)")
    k = parser.add_argument_group("cluster")
    k.add_argument("--replicas", type=int, default=1, help="engine replicas behind the router")
    k.add_argument("--router", choices=ROUTERS.names(), default="round_robin")
    k.add_argument("--pd", type=_pd, default=None, metavar="P:D",
                   help="prefill/decode disaggregation: P prefill and D decode replicas (replaces --replicas)")
    k.add_argument("--kv-bytes-per-token", type=int, default=None,
                   help="PD: KV bytes of one token (default: the roofline model's, or the profile's)")
    k.add_argument("--kv-link-gbps", type=float, default=25.0, help="PD: GB/s from a prefill to a decode replica")
    k.add_argument("--kv-link-latency-ms", type=float, default=0.5, help="PD: latency of one KV transfer")
    k.add_argument("--api-server-ms", type=float, default=None,
                   help="the API server's time per request before a replica has it, a delay: requests sent "
                        "together arrive together (default: the linear profile's api_server_s, 0 for the roofline)")
    k.add_argument("--api-server-burst-ms", type=float, default=None,
                   help="more API server time per request of a burst: N requests sent at one instant reach a "
                        "replica together, N - 1 times this later than a lone one (default: the linear profile's "
                        "api_server_burst_s, 0 for the roofline)")


def add_result_args(parser: argparse.ArgumentParser) -> None:
    o = parser.add_argument_group("output")
    o.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:1000 tpot:100")
    o.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el")
    o.add_argument("--metric-percentiles", default="50,90,99")
    o.add_argument("--output-json", default=None, help="write the list of result objects here")


def add_run_args(parser: argparse.ArgumentParser) -> None:
    add_workload_args(parser)
    add_deployment_args(parser)
    add_result_args(parser)
    parser.add_argument("--per-request", action="store_true",
                        help="also vLLM's per-request lists (ttfts, itls, lens, errors) in the JSON")
    parser.add_argument("--no-check-request", dest="check_request", action="store_false",
                        help="leave out the check request bench serve sends (and waits for) before its timed "
                             "run: the dataset's first prompt with 4 tokens, which puts that prompt in the "
                             "prefix cache")


def build_setup(args: argparse.Namespace, config: EngineConfig) -> SimSetup:
    """The deployment the options describe."""
    roofline = RooflineOptions(args.model_config, args.tp, args.compute_efficiency, args.bandwidth_efficiency,
                               args.step_overhead_ms / 1000.0, config.gpu_memory_utilization)
    cost, blocks, max_len, kv_bytes, model = resolve_cost(args.profile, config, roofline, args.num_kv_blocks)
    api_server_s = (args.api_server_ms / 1000.0 if args.api_server_ms is not None
                    else getattr(cost, "api_server_s", 0.0))
    burst_s = (args.api_server_burst_ms / 1000.0 if args.api_server_burst_ms is not None
               else getattr(cost, "api_server_burst_s", 0.0))
    cluster = ClusterSpec(args.replicas, args.router, args.pd, args.kv_bytes_per_token or kv_bytes,
                          args.kv_link_gbps * 1e9, args.kv_link_latency_ms / 1000.0, api_server_s, burst_s)
    return SimSetup(config, cost, blocks, max_len, cluster, model)


def setup_summary(setup: SimSetup) -> dict[str, Any]:
    config = setup.config
    return {"profile": setup.cost.name, "num_kv_blocks": setup.num_blocks, "max_model_len": setup.max_model_len,
            "cluster": dataclasses.asdict(setup.cluster),
            "engine": {name: getattr(config, name) for name in SCHEDULER_FIELDS}}


def run_one(args: argparse.Namespace, setup: SimSetup, per_request: bool = False) -> dict[str, Any]:
    """Simulates the workload the options name on ``setup``; returns the result object."""
    requests = build_sim_requests(args, setup.max_model_len)
    started = time.perf_counter()
    run = simulate(setup, requests, keep_token_times=per_request,
                   with_check_request=getattr(args, "check_request", False))
    wall = time.perf_counter() - started
    fixed = args.request_rate is None and args.dataset == "jsonl"
    rate = None if fixed else (args.request_rate if args.request_rate is not None else math.inf)
    label = "trace" if rate is None else f"{rate:g}"
    config = {"dataset": args.dataset, "dataset_path": args.dataset_path, "num_prompts": len(requests),
              "request_rate": label, "burstiness": args.burstiness, "seed": args.seed,
              "input_len": args.input_len, "output_len": args.output_len, **setup_summary(setup)}
    extra = {**run.stats(), "wall_s": wall, "virtual_s": run.end_s}
    return simulated_result(run.recorder, [r.tag for r in sorted(requests, key=lambda r: r.index)],
                            name=f"sim-{args.dataset}@{label}", model=setup.model, config=config,
                            slos=parse_goodput(args.goodput), metrics=parse_percentile_metrics(args.percentile_metrics),
                            percentiles=parse_metric_percentiles(args.metric_percentiles), rate=rate,
                            burstiness=args.burstiness, extra=extra, per_request=per_request)


def run_simulate(args: argparse.Namespace, config: EngineConfig) -> list[dict[str, Any]]:
    result = run_one(args, build_setup(args, config), args.per_request)
    print(format_serve_result(result))
    if args.output_json:
        write_results([result], args.output_json)
    return [result]


def add_calibrate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="a step trace: the JSONL an engine writes with --trace")
    parser.add_argument("--out", required=True, help="where to write the profile JSON")
    parser.add_argument("--name", default=None, help="the profile's name (default: the output file's stem)")
    parser.add_argument("--num-kv-blocks", type=int, default=None,
                        help="the traced engine's KV blocks (its log says it), kept as the profile's default")
    parser.add_argument("--max-model-len", type=int, default=None, help="the traced engine's max_model_len")
    parser.add_argument("--model", default=None, help="the traced model's name, kept in the profile")
    parser.add_argument("--api-server-ms", type=float, default=0.0,
                        help="the API server's measured time per request before the engine has it, kept in the "
                             "profile (scripts/sim_calibrate.py measures it)")
    parser.add_argument("--api-server-burst-ms", type=float, default=0.0,
                        help="the API server's measured time per request of a burst (requests sent at one "
                             "instant), kept in the profile (scripts/sim_calibrate.py measures it)")
    parser.add_argument("--speed-probe-ms", type=float, nargs=2, default=None, metavar=("DECODE", "PREFILL"),
                        help="the machine-speed probe's one-row decode step and prefill step measured with the "
                             "trace, kept in the profile (scripts/sim_calibrate.py measures them; "
                             "folovllm/simulator/speed.py)")
    parser.add_argument("--weighting", choices=("absolute", "sqrt", "relative"), default="absolute",
                        help="least squares of each step's error in seconds (default: the long prefill steps "
                             "that set TTFT count most), of its relative error, or of error² / duration (sqrt)")
    parser.add_argument("--prefill-knee", type=prefill_knee, default="auto", metavar="auto|TOKENS",
                        help="where the below-knee prefill term (a step's first TOKENS prefill tokens cost extra) "
                             "stops counting: auto (default) keeps the candidate that fits best, 0 fits a straight "
                             "line in prefill tokens")


def prefill_knee(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        tokens = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'auto' or a number of tokens, not {value!r}") from None
    if tokens < 0:
        raise argparse.ArgumentTypeError(f"a number of tokens >= 0, not {tokens}")
    return tokens


def run_calibrate(args: argparse.Namespace) -> int:
    from folovllm.simulator.calibrate import calibrate, format_fit

    defaults = {k: v for k, v in (("num_kv_blocks", args.num_kv_blocks), ("max_model_len", args.max_model_len),
                                  ("model", args.model)) if v is not None}
    speed_probe = None if args.speed_probe_ms is None else {
        "decode_step_s": args.speed_probe_ms[0] / 1000.0, "prefill_step_s": args.speed_probe_ms[1] / 1000.0}
    model = calibrate(args.trace, args.out, args.name or Path(args.out).stem, defaults, args.weighting,
                      args.api_server_ms / 1000.0, args.prefill_knee, args.api_server_burst_ms / 1000.0,
                      speed_probe)
    print(format_fit(model))
    print(f"wrote {args.out}")
    return 0

