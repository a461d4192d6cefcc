"""HuggingFace transformers ``generate`` baselines on the same weights and requests, greedy, EOS ignored.

- ``hf-sequential``: one request at a time (optionally on the first K requests only).
- ``hf-static``: one left-padded batch of all prompts, run until the longest request is done; only each
  request's own ``max_tokens`` count as output, the rest is reported as computed-but-wasted.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GgufConfig, PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from folovllm.bench.results import (
    CpuShare,
    RequestTiming,
    build_result,
    prefill_tok_s,
    read_peak_rss_mb,
    reset_peak_rss,
)
from folovllm.bench.workloads import BenchRequest

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"Unsupported dtype {dtype!r}; choose one of {sorted(TORCH_DTYPES)}.")
    return TORCH_DTYPES[dtype]


def load_hf_model(model_path: str | Path, dtype: str, device: str = "cpu") -> PreTrainedModel:
    """Load a .gguf file or a HF model folder, offline, as a dense model in ``dtype``.

    GGUF weights are dequantized at load time (not kept packed) so HF runs plain dense matmuls.
    """
    path = Path(model_path)
    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch_dtype(dtype), local_files_only=True,
            quantization_config=GgufConfig(dequantize=True),
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype), local_files_only=True)
    return model.to(device).eval()


class _StepTimer(BaseStreamer):
    """Records when each decoding step's tokens reach the host; ``generate`` first puts the prompt."""

    def __init__(self) -> None:
        self.step_times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.step_times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        pass


def _pad_token_id(model: PreTrainedModel) -> int:
    for cfg in (model.generation_config, model.config):
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(cfg, name, None)
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None:
                return int(value)
    return 0


@torch.inference_mode()
def _generate(
    model: PreTrainedModel, prompts: list[list[int]], max_new_tokens: int
) -> tuple[torch.Tensor, _StepTimer]:
    """Greedy, left-padded, exactly ``max_new_tokens`` per row (min_new_tokens suppresses EOS)."""
    pad_id = _pad_token_id(model)
    width = max(len(p) for p in prompts)
    device = model.device
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    timer = _StepTimer()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        streamer=timer,
    )
    new_tokens = out.shape[1] - width
    if new_tokens != max_new_tokens or len(timer.step_times) != max_new_tokens:
        raise RuntimeError(
            f"HF generate made {new_tokens} tokens ({len(timer.step_times)} steps), expected {max_new_tokens}."
        )
    return out[:, width:], timer


def warm_up(model: PreTrainedModel, requests: list[BenchRequest]) -> None:
    """A short batched and single run so the timed runs do not pay first-call costs."""
    prompts = [list(r.prompt_token_ids[:16]) for r in requests[:2]]
    _generate(model, prompts, 4)
    _generate(model, prompts[:1], 4)


def run_sequential(model: PreTrainedModel, requests: list[BenchRequest]) -> tuple[list[RequestTiming], float]:
    """One request at a time. Latencies run from each request's own start (no queueing behind others)."""
    timings = []
    t0 = time.perf_counter()
    for req in requests:
        start = time.perf_counter()
        _, timer = _generate(model, [list(req.prompt_token_ids)], req.max_tokens)
        timings.append(RequestTiming(
            num_prompt_tokens=len(req.prompt_token_ids), num_output_tokens=req.max_tokens,
            arrival_time=start, first_token_time=timer.step_times[0], finished_time=timer.step_times[-1],
            token_times=timer.step_times,
        ))
    return timings, time.perf_counter() - t0


def run_static(model: PreTrainedModel, requests: list[BenchRequest]) -> tuple[list[RequestTiming], float, int]:
    """All prompts in one padded batch until the longest is done.

    Returns per-request timings (request i is done at step max_tokens_i), the wall time of the whole
    batch, and the number of output tokens computed (batch × longest).
    """
    max_new = max(r.max_tokens for r in requests)
    t0 = time.perf_counter()
    out, timer = _generate(model, [list(r.prompt_token_ids) for r in requests], max_new)
    duration = time.perf_counter() - t0
    steps = timer.step_times
    timings = [
        RequestTiming(
            num_prompt_tokens=len(r.prompt_token_ids), num_output_tokens=r.max_tokens,
            arrival_time=t0, first_token_time=steps[0], finished_time=steps[r.max_tokens - 1],
            token_times=steps[: r.max_tokens],
        )
        for r in requests
    ]
    return timings, duration, out.numel()


def _sequential_prefill_tok_s(timings: list[RequestTiming]) -> float:
    """Prompt tokens / summed TTFT: the single-request prefill rate."""
    return sum(t.num_prompt_tokens for t in timings) / sum(t.ttft for t in timings)  # type: ignore[misc]


def run_hf_baselines(
    model_path: str | Path,
    requests: list[BenchRequest],
    *,
    name: str,
    dtype: str,
    device: str = "cpu",
    sequential_requests: int | None = None,
    config: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Load the weights once and return [hf-static, hf-sequential] result dicts.

    ``sequential_requests`` limits hf-sequential to the first K requests (it is slow); 0 skips it.
    """
    if not requests:
        raise ValueError("run_hf_baselines needs at least one request.")
    reset_peak_rss()
    model = load_hf_model(model_path, dtype, device)
    load_peak = read_peak_rss_mb()
    warm_up(model, requests)
    common = dict(name=name, model=Path(model_path).name, dtype=dtype, device=device)
    base_config = {**(config or {}), "threads": torch.get_num_threads()}

    reset_peak_rss()
    share = CpuShare(torch.get_num_threads())
    timings, duration, computed = run_static(model, requests)
    cpu_share = share.stop()
    run_peak = read_peak_rss_mb()
    results = [build_result(
        engine="hf-static", timings=timings, duration_s=duration, peak_memory_mb=max(load_peak, run_peak),
        config={**base_config, "batch_size": len(requests), "max_new_tokens": max(r.max_tokens for r in requests)},
        extra={"computed_output_tokens": computed, "prefill_tok_s": prefill_tok_s(timings),
               "run_peak_rss_mb": run_peak, "cpu_share": cpu_share},
        **common,
    )]

    k = len(requests) if sequential_requests is None else min(sequential_requests, len(requests))
    if k > 0:
        reset_peak_rss()
        share = CpuShare(torch.get_num_threads())
        timings, duration = run_sequential(model, requests[:k])
        cpu_share = share.stop()
        run_peak = read_peak_rss_mb()
        results.append(build_result(
            engine="hf-sequential", timings=timings, duration_s=duration, peak_memory_mb=max(load_peak, run_peak),
            config={**base_config, "batch_size": 1, "requests_run": k, "requests_in_workload": len(requests)},
            extra={"prefill_tok_s": _sequential_prefill_tok_s(timings), "run_peak_rss_mb": run_peak,
                   "cpu_share": cpu_share},
            **common,
        ))
    return results
