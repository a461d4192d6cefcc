"""Every GPU figure of the CUDA fast path in one unattended run: a table on stdout and one JSON file.

    python scripts/gpu_bench.py                                    # on an H100/H200: a few minutes
    python scripts/gpu_bench.py --skip attention_backends,hf_generate --output-json /tmp/gpu.json
    python scripts/gpu_bench.py --smoke --output-json /tmp/smoke.json   # CPU, tiny model, same code path
    python scripts/gpu_bench.py --time-limit 270                   # skip what would start after 270 s

Model: the Qwen3-0.6B architecture (benchmarks/configs/qwen3-0.6b/config.json) with random weights
(``load_format="dummy"``; the HF baseline runs last, on its own random init), bfloat16, token-id prompts, ``ignore_eos``, no detokenization (the dummy model has no
Qwen3 tokenizer). Sections, each timed after a warm-up (CUDA-graph capture and Triton JIT excluded):

- hf_generate: transformers' ``generate``, one left-padded static batch of the decode-heavy workload (sdpa).
- nano_vllm_offline: nano-vllm's bench.py workload (256 requests, input and output lengths uniform in
  100..1024, ids 0..10000, temperature 0.6, python ``random.seed(0)``).
- decode_heavy (128 × 10 → 512) and prefill_heavy (128 × 1024 → 16): the reference serving workloads, greedy.
- step_time: median decode step wall time at batch 1 and 128 against the floor
  (weight bytes + KV bytes read per step) / device copy bandwidth (2 × bytes / time of a big tensor copy), and
  the same steps' median span on the device's timeline (CUDA events).
- prefill_profile: prefill-heavy's first three full prefill steps under torch.profiler (the kernels with the
  most device time per step, their sum, the step time), fused forms on (the default).
- decode_graph: the decode graph of batch 1 and 128: kernels per replay (profiler), device ms per replay, the
  same step run eagerly (kernels, ms).
- fused_ab: an engine with ``FOLOVLLM_CUDA_FUSED_OPS=off`` beside the default one: greedy tokens of a
  logprobs workload compared by the top-2 rule, and each side's batch-1 step, decode-heavy and prefill-heavy.
- attention_kernels: the Triton prefill kernel (its tiles and 64-row ones) and decode kernel (split over the
  context and not) against SDPA at Qwen3-0.6B's attention shape.
- overlap: host time per step (EngineStats.host_time_s / num_steps) and step wall time with overlap
  scheduling on and off; greedy outputs must be identical.
- cuda_graphs: decode-heavy with ``enforce_eager=True``; attention_backends: decode-heavy per backend.

Every timed run also records host ms per step (the engine's own accounting) and, on CUDA, device ms per step
(an event after each step). Each section is independent (try/except); an error is recorded as a string in
the JSON. The report is
written after every section, and ``--time-limit`` skips the sections that would start past it (and cuts a
timed run short), so a run inside a device lease always leaves what it finished.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

from folovllm import LLM, SamplingParams
from folovllm.bench import hf_baseline
from folovllm.bench.gpu_kernels import attention_figures, decode_graph_figures
from folovllm.bench.gpu_runs import (
    GPU_SCALE,
    SMOKE_CONFIG,
    SMOKE_SCALE,
    Run,
    bar_rows,
    copy_bandwidth,
    format_table,
    free_device_memory,
    greedy_match,
    nano_vllm_requests,
    run_workload,
    save_tokenizer,
    seed000_requests,
    sync,
    versions,
)
from folovllm.bench.profile import profile_steps
from folovllm.bench.results import build_result
from folovllm.bench.workloads import BenchRequest, build_workload
from folovllm.paging import blocks_for_tokens

QWEN3_CONFIG = ROOT / "benchmarks/configs/qwen3-0.6b/config.json"
DEFAULT_OUTPUT = ROOT / "docs/results/gpu-bench.json"
SECTIONS = ("hf_generate", "nano_vllm_offline", "decode_heavy", "prefill_heavy", "step_time", "prefill_profile",
            "decode_graph", "fused_ab", "overlap", "cuda_graphs", "attention_backends", "attention_kernels")
FUSED_SWITCH = "FOLOVLLM_CUDA_FUSED_OPS"


class GpuBench:
    """Builds the engines one after the other (one on the device at a time) and fills ``sections``."""

    def __init__(self, args: argparse.Namespace, output: Path) -> None:
        self.start = time.perf_counter()
        self.output = output
        self.smoke = args.smoke
        self.scale = SMOKE_SCALE if args.smoke else GPU_SCALE
        self.device = self.scale.engine_args["device"]
        self.skip = set(args.skip)
        self.deadline = self.start + args.time_limit if args.time_limit else None
        # the CPU smoke run keeps torch's matmuls, as the GPU path runs them (its prefill profile is led by them)
        os.environ.setdefault("FOLOVLLM_CPU_LINEAR", "torch")
        self.engine_args = {"dtype": "bfloat16", "load_format": "dummy", "seed": 0,
                            "max_num_batched_tokens": args.max_num_batched_tokens,
                            "attention_backend": args.attention_backend,
                            "overlap_scheduling": True,  # (auto would leave it off in the CPU smoke run)
                            **self.scale.engine_args}
        if args.smoke:
            self.engine_args["max_num_batched_tokens"] = min(args.max_num_batched_tokens, 256)
        self.workdir = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
        self.model_dir, self.tokenizer = self._model_folder()
        self.model_name = "qwen3-tiny" if args.smoke else "qwen3-0.6b"
        self.device_name = (torch.cuda.get_device_name() if self.device.startswith("cuda")
                            else f"cpu ({platform.processor() or platform.machine()})")
        self.sections: dict[str, Any] = {}
        self.main_runs: dict[str, Run] = {}
        self.bandwidth = 0.0  # bytes/s, measured first thing in run()
        self.memory_in_use_gb: list[float] = []  # device memory allocated before each engine start-up

    def _model_folder(self) -> tuple[Path, str]:
        """The config (Qwen3-0.6B, or the toy one for --smoke) and a tokenizer, in a temp folder."""
        folder = self.workdir / "model"
        folder.mkdir()
        if self.smoke:
            (folder / "config.json").write_text(json.dumps(SMOKE_CONFIG, indent=2))
        else:
            shutil.copy(QWEN3_CONFIG, folder / "config.json")
        return folder, save_tokenizer(folder)

    # -- plumbing -------------------------------------------------------------------------------

    def section(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if name in self.skip:
            self.sections[name] = {"skipped": True}
            return
        if self.seconds_left() <= 0:
            self.sections[name] = {"skipped": "time limit"}
            self.save()
            return
        print(f"[gpu_bench] {name} ...", flush=True)
        start = time.perf_counter()
        try:
            self.sections[name] = fn()
        except Exception as e:  # one failing section must not cost the others
            traceback.print_exc()
            self.sections[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        self.sections[name]["section_s"] = time.perf_counter() - start
        print(f"[gpu_bench] {name} done in {time.perf_counter() - start:.1f} s", flush=True)
        self.save()

    def seconds_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()

    def make_llm(self, **overrides: Any) -> tuple[LLM, float]:
        """An engine on the dummy weights (seed 0: every engine the same ones), warmed up; returns it and its
        start-up seconds."""
        free_device_memory()
        if self.device.startswith("cuda"):  # what an earlier engine may have left behind
            self.memory_in_use_gb.append(torch.cuda.memory_allocated() / 2**30)
        start = time.perf_counter()
        llm = LLM(str(self.model_dir), **{**self.engine_args, **overrides})
        startup = time.perf_counter() - start
        self.warm_up(llm)
        return llm, startup

    def warm_up(self, llm: LLM) -> None:
        """Short mixed runs: prefill chunks, mixed steps, decode at several batch sizes, greedy and sampled."""
        vocab = llm.llm_engine.model.arch.vocab_size
        top = min(1100, self.engine_args["max_model_len"] // 2)
        rng = random.Random(1)
        num = self.scale.num_warmup_requests
        requests = [BenchRequest([rng.randrange(vocab) for _ in range(rng.randint(1, top))], rng.randint(2, 16))
                    for _ in range(num)] + [BenchRequest([rng.randrange(vocab) for _ in range(11)], 8)] * num
        self.run_workload(llm, "warm-up", requests, config=self.run_config({}), temperature=[0.0, 0.6] * num)

    def run_workload(self, llm: LLM, name: str, requests: list[BenchRequest], **kwargs: Any) -> Run:
        limit = min(self.scale.run_time_limit_s, self.seconds_left())
        if limit <= 0:
            raise TimeoutError(f"{name}: no time left of --time-limit")
        return run_workload(llm, name, requests, device=self.device, time_limit_s=limit, **kwargs)

    def run_config(self, overrides: dict[str, Any]) -> dict[str, Any]:
        return {"model_name": self.model_name, "device_name": self.device_name,
                "engine": {**self.engine_args, **overrides}}

    def workloads(self, vocab_size: int) -> dict[str, list[BenchRequest]]:
        s = self.scale
        return {"nano_vllm_offline": nano_vllm_requests(*s.nano, vocab_size),
                "decode_heavy": seed000_requests("decode-heavy", s.decode_heavy, vocab_size),
                "prefill_heavy": seed000_requests("prefill-heavy", s.prefill_heavy, vocab_size),
                "batch_1": seed000_requests("decode-heavy", (1, 10, s.batch1_output_len), vocab_size),
                # greedy with logprobs, compared across engines by the top-2 rule
                "compare": build_workload("decode-heavy", vocab_size, num_requests=s.compare[0],
                                          input_len=s.compare[1], output_len=s.compare[2], seed=1)}

    # -- sections -------------------------------------------------------------------------------

    def hf_generate(self) -> dict[str, Any]:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(self.model_dir, local_files_only=True)
        torch.manual_seed(0)
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        model.eval()
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        requests = self.workloads(config.vocab_size)["decode_heavy"]
        try:
            hf_baseline.warm_up(model, requests)
            sync(self.device)
            timings, duration, computed = hf_baseline.run_static(model, requests)
            sync(self.device)
            peak = torch.cuda.max_memory_allocated() / 2**20 if self.device.startswith("cuda") else None
        finally:
            del model
            free_device_memory()
        result = build_result(name="decode-heavy", engine="hf-static", model=self.model_name, dtype="bfloat16",
                              device=self.device_name, timings=timings, duration_s=duration, peak_memory_mb=peak,
                              config={"batch_size": len(requests), "attn_implementation": "sdpa",
                                      "max_new_tokens": max(r.max_tokens for r in requests), "do_sample": False},
                              extra={"computed_output_tokens": computed})
        return result

    def main_engine(self) -> None:
        """The default configuration, one engine: nano-vllm's and the reference workloads, the step times."""
        names = ("nano_vllm_offline", "decode_heavy", "prefill_heavy", "step_time", "prefill_profile", "decode_graph")
        if self.seconds_left() <= 0:
            self.sections.update({name: {"skipped": "time limit"} for name in names})
            return
        try:
            llm, startup = self.make_llm()
        except Exception as e:
            traceback.print_exc()
            for name in names:
                self.sections[name] = {"error": f"engine start-up failed: {type(e).__name__}: {e}"}
            return
        work = self.workloads(llm.llm_engine.model.arch.vocab_size)
        config = self.run_config({"startup_s": startup})

        def timed(name: str, temperature: float = 0.0, steady: bool = False) -> dict[str, Any]:
            run = self.run_workload(llm, name.replace("_", "-"), work[name], config=config,
                                    temperature=temperature, steady_batch=len(work[name]) if steady else None)
            self.main_runs[name] = run
            return run.result

        def step_time() -> dict[str, Any]:
            timed("batch_1", steady=True)
            return self.step_times(llm.llm_engine.model)

        self.section("nano_vllm_offline", lambda: timed("nano_vllm_offline", temperature=0.6))
        self.section("decode_heavy", lambda: timed("decode_heavy", steady=True))
        self.section("prefill_heavy", lambda: timed("prefill_heavy"))
        self.section("step_time", step_time)
        self.section("prefill_profile", lambda: self.prefill_profile(llm.llm_engine, work["prefill_heavy"]))
        self.section("decode_graph", lambda: decode_graph_figures(llm.llm_engine, (1, self.scale.decode_heavy[0])))
        if "fused_ab" not in self.skip and self.seconds_left() > 0:
            try:
                self.main_runs["compare"] = self.run_workload(llm, "compare", work["compare"], config=config,
                                                              logprobs=2)
            except Exception as e:  # fused_ab reports it
                traceback.print_exc()
                self.sections["fused_ab"] = {"error": f"the fused-on compare run failed: {type(e).__name__}: {e}"}
        llm = None  # frees the engine (the closures above share this cell)
        free_device_memory()

    def step_times(self, model: torch.nn.Module) -> dict[str, Any]:
        """Median steady decode step at batch 1 and at the decode-heavy batch, against the floor."""
        arch = model.arch
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights once
        kv_bytes_per_token = 2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * 2  # K+V, bf16
        out: dict[str, Any] = {"copy_bandwidth_gb_s": self.bandwidth / 1e9, "weight_bytes": weight_bytes,
                               "kv_bytes_per_token": kv_bytes_per_token}
        for name in ("batch_1", "decode_heavy"):
            run = self.main_runs.get(name)
            label = f"batch_{len(run.token_ids) if run else self.scale.decode_heavy[0]}"
            if run is None or not run.step_walls_s:
                out[label] = {"error": f"no steady decode steps recorded in the {name} run"}
                continue
            walls = sorted(run.step_walls_s)
            context = statistics.mean(run.step_contexts)
            floor_s = (weight_bytes + kv_bytes_per_token * context) / self.bandwidth
            median_s = statistics.median(walls)
            out[label] = {"batch": run.result["num_requests"], "num_steady_steps": len(walls),
                          "median_step_ms": 1000 * median_s, "p90_step_ms": 1000 * walls[int(0.9 * (len(walls) - 1))],
                          "median_device_step_ms": 1000 * statistics.median(run.step_device_s)
                          if run.step_device_s else None,
                          "host_ms_per_step": run.result["extra"]["host_ms_per_step"],
                          "mean_context_tokens": context, "floor_ms": 1000 * floor_s, "ratio": median_s / floor_s}
        return out

    def prefill_profile(self, engine: Any, requests: list[BenchRequest], steps: int = 3) -> dict[str, Any]:
        """The first full prefill steps of prefill-heavy's prompts under torch.profiler (bench/profile.py): where
        a step's time goes, kernel by kernel; the rest of the prompts then finish unprofiled. The timed run
        left these prompts in the prefix cache, which is emptied first: the steps compute every token."""
        engine.reset_prefix_cache()
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
        for i, request in enumerate(requests):
            engine.add_request({"prompt_token_ids": request.prompt_token_ids}, params, request_id=f"profile-{i}")
        try:
            return {"num_requests": len(requests), "prompt_len": len(requests[0].prompt_token_ids),
                    **profile_steps(engine, steps)}
        finally:
            while engine.has_unfinished_requests():
                engine.step()

    def variant(self, **overrides: Any) -> Run:
        """Decode-heavy on a fresh engine with ``overrides``; its KV cache sized for that workload only."""
        num, input_len, output_len = self.scale.decode_heavy
        block = self.engine_args.get("block_size", 16)
        blocks = max(num * blocks_for_tokens(input_len + output_len, block) * 5 // 4,
                     blocks_for_tokens(self.engine_args["max_model_len"], block))
        llm, startup = self.make_llm(num_gpu_blocks_override=blocks, **overrides)
        try:
            requests = self.workloads(llm.llm_engine.model.arch.vocab_size)["decode_heavy"]
            config = self.run_config({"num_gpu_blocks_override": blocks, **overrides, "startup_s": startup})
            return self.run_workload(llm, "decode-heavy", requests, config=config, steady_batch=len(requests))
        finally:
            del llm
            free_device_memory()

    @staticmethod
    def _summary(run: Run) -> dict[str, Any]:
        extra = run.result["extra"]
        return {"output_tok_s": run.result["output_tok_s"], "input_tok_s": run.result["input_tok_s"],
                "num_steps": run.num_steps, "wall_ms_per_step": extra["wall_ms_per_step"],
                "host_ms_per_step": extra["host_ms_per_step"], "device_ms_per_step": extra["device_ms_per_step"],
                "median_decode_step_ms": 1000 * statistics.median(run.step_walls_s) if run.step_walls_s else None,
                "median_device_step_ms": 1000 * statistics.median(run.step_device_s) if run.step_device_s else None}

    def overlap(self) -> dict[str, Any]:
        on = self.main_runs.get("decode_heavy")
        if on is None:
            raise RuntimeError("needs the decode_heavy run (overlap on)")
        off = self.variant(overlap_scheduling=False)
        same = sum(a == b for a, b in zip(on.token_ids, off.token_ids))
        return {"on": self._summary(on), "off": self._summary(off), "num_compared": len(on.token_ids),
                "num_identical": same, "outputs_identical": same == len(on.token_ids) == len(off.token_ids)}

    def fused_ab(self) -> dict[str, Any]:
        """The default engine (fused forms on) against one with them off: greedy tokens by the top-2 rule, and
        each side's batch-1 decode step, decode-heavy and prefill-heavy."""
        on = self.main_runs.get("compare")
        if on is None:
            raise RuntimeError("needs the default engine's compare run (fused forms on)")
        previous = os.environ.get(FUSED_SWITCH)
        os.environ[FUSED_SWITCH] = "off"  # the platform reads it as the engine is built
        try:
            llm, startup = self.make_llm()
        finally:
            if previous is None:
                os.environ.pop(FUSED_SWITCH)
            else:
                os.environ[FUSED_SWITCH] = previous
        try:
            work = self.workloads(llm.llm_engine.model.arch.vocab_size)
            config = self.run_config({"startup_s": startup, "env": {FUSED_SWITCH: "off"}})
            off = self.run_workload(llm, "compare", work["compare"], config=config, logprobs=2)
            out: dict[str, Any] = {**greedy_match(on.token_ids, off.token_ids, off.top2_gaps),
                                   "num_compared": len(on.token_ids)}
            runs = {name: self.run_workload(llm, name, work[name], config=config, steady_batch=len(work[name])
                                            if name != "prefill_heavy" else None)
                    for name in ("batch_1", "decode_heavy", "prefill_heavy")}
        finally:
            del llm
            free_device_memory()
        for name, run in runs.items():
            on_run = self.main_runs.get(name)
            out[name] = {"off": self._summary(run), "on": self._summary(on_run) if on_run else None}
            key = "input_tok_s" if name == "prefill_heavy" else "output_tok_s"
            out[name]["on_over_off"] = on_run.result[key] / run.result[key] if on_run else None
        return out

    def cuda_graphs(self) -> dict[str, Any]:
        graphs = self.main_runs.get("decode_heavy")
        if graphs is None:
            raise RuntimeError("needs the decode_heavy run (CUDA graphs on)")
        eager = self.variant(enforce_eager=True)
        return {"graphs": self._summary(graphs), "eager": self._summary(eager),
                "speedup": graphs.result["output_tok_s"] / eager.result["output_tok_s"]}

    def attention_backends(self) -> dict[str, Any]:
        names = ("torch", "triton") if self.device.startswith("cuda") else ("torch",)
        out: dict[str, Any] = {}
        for name in names:
            try:
                out[name] = self._summary(self.variant(attention_backend=name))
            except Exception as e:
                traceback.print_exc()
                out[name] = {"error": f"{type(e).__name__}: {e}"}
        return out

    def attention_kernels(self) -> dict[str, Any]:
        if not self.device.startswith("cuda"):
            return {"skipped": "the Triton kernels run compiled on CUDA only (their CPU tests run the interpreter)"}
        return attention_figures(self.device)

    # -- the whole run --------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        try:
            self.bandwidth = copy_bandwidth(self.scale.copy_bytes, self.device)
            # the bars' figures first: a run cut short by --time-limit loses the older comparisons
            self.main_engine()
            if "error" not in self.sections.get("fused_ab", {}):
                self.section("fused_ab", self.fused_ab)
            self.section("attention_kernels", self.attention_kernels)
            self.section("cuda_graphs", self.cuda_graphs)
            self.section("overlap", self.overlap)
            self.section("attention_backends", self.attention_backends)
            self.section("hf_generate", self.hf_generate)
            hf, ours = self.sections.get("hf_generate", {}), self.sections.get("decode_heavy", {})
            if "output_tok_s" in hf and "output_tok_s" in ours:
                hf["ours_over_hf"] = ours["output_tok_s"] / hf["output_tok_s"]
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.save()

    def save(self) -> dict[str, Any]:
        """Writes the report so far: a run cut off midway still leaves the sections it finished."""
        report = {"name": "gpu-bench", "smoke": self.smoke, "model": self.model_name,
                  "weights": "dummy, seed 0 (the HF baseline: its own random init)",
                  "tokenizer": self.tokenizer, "dtype": "bfloat16", "device": self.device_name,
                  "versions": versions(), "engine_config": self.engine_args,
                  "copy_bandwidth_gb_s": self.bandwidth / 1e9,
                  "memory_in_use_before_engines_gb": self.memory_in_use_gb,
                  "duration_s": time.perf_counter() - self.start, "sections": self.sections,
                  "bars": bar_rows(self.sections, self.smoke)}
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self.output.write_text(json.dumps(report, indent=2) + "\n")
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-json", type=Path, default=None,
                        help=f"default {DEFAULT_OUTPUT.relative_to(ROOT)} (--smoke: a temp file)")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny Qwen3 config, few tokens: checks the path")
    parser.add_argument("--skip", type=lambda s: [x for x in s.split(",") if x], default=[],
                        help=f"comma-separated sections to skip: {', '.join(SECTIONS)}")
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384, help="as nano-vllm's default")
    parser.add_argument("--attention-backend", default="auto", choices=("auto", "torch", "triton"))
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds: sections that would start later are skipped (recorded as such)")
    args = parser.parse_args()
    unknown = set(args.skip) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: run on an H100/H200, or pass --smoke for the CPU check")
    output = args.output_json or (Path(tempfile.gettempdir()) / "gpu-bench-smoke.json" if args.smoke
                                  else DEFAULT_OUTPUT)
    report = GpuBench(args, output).run()
    print(format_table(report))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
