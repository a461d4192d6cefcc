"""Engine configuration: one frozen dataclass of knobs, validated on construction, resolved once.

Each field's metadata carries its command-line help (and choices, or a flag name that differs from
``--field-name``), so the CLI is derived from this class and no default is written twice.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
               "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30}
DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 2**30
QUANTIZATIONS = ("auto", "gptq", "int8")
# The CPU attention kernel's torch op library, built by `make kernels` (csrc/build.py) in a source checkout.
CPU_ATTENTION_LIBRARY = (Path(__file__).resolve().parent.parent / "build" / "cpu_attention"
                         / "libfolovllm_cpu_attention.so")

logger = logging.getLogger(__name__)


def parse_size(text: str | int) -> int:
    """Parses a memory size like ``512MiB``, ``2GiB`` or a plain byte count."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"cannot parse memory size {text!r}; use e.g. 512MiB or 2GiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), the default for ``num_threads``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def knob(default: Any, help: str | None = None, *, choices: list[str] | None = None,
         flag: str | None = None, cli: bool = True) -> Any:
    """A config field with its command-line description.

    ``flag``: the option's name when it is not ``--field-name`` (a ``--no-x`` flag turns a field off);
    ``cli=False``: the field has no flag (set it from Python).
    """
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag, "cli": cli})


@dataclass(frozen=True)
class EngineConfig:
    """Every engine knob, with vLLM's names where vLLM has one.

    ``auto`` values are decided by ``resolve()``, once, when the engine starts; code below the
    engine reads resolved values only.
    """

    model: str | None = knob(None, "a .gguf file or HF folder (default: SmolLM2-135M-Instruct)")
    dtype: str = knob("auto", "auto = bfloat16", choices=["auto", *_DTYPES])
    device: str = knob("auto", "auto = cuda if available, else cpu; or cpu, cuda, cuda:N")
    load_format: str = knob("auto", "dummy: random weights from the model's config (tests, ablations)",
                            choices=["auto", "dummy"])
    quantization: str = knob("auto", "auto: as the checkpoint says; gptq: insist on a GPTQ checkpoint; "
                                     "int8: quantize a float checkpoint's linear weights to int8 at load",
                             choices=list(QUANTIZATIONS))
    seed: int = knob(0, "seed for dummy weights and torch")
    max_model_len: int | None = knob(None, "longest prompt + output (default: the model's maximum)")
    max_num_seqs: int = knob(256, "most requests running at once")
    max_num_batched_tokens: int = knob(2048, "most tokens one step computes")
    block_size: int = knob(16, "tokens per KV cache block")
    kv_cache_memory: int | str | None = knob(None, "CPU KV cache size, e.g. 2GiB (default)")
    gpu_memory_utilization: float = knob(0.9, "CUDA: fraction of device memory the engine may use")
    num_gpu_blocks_override: int | None = knob(None, "fixes the block count (tests, ablations)", cli=False)
    enable_chunked_prefill: bool = knob(True, "prefill whole prompts in one step", flag="--no-chunked-prefill")
    long_prefill_token_threshold: int = knob(
        0, "cap each prompt's chunk per step so short requests can join (0 = off)")
    enable_prefix_caching: bool = knob(True, "turn automatic prefix caching off (ablation)",
                                       flag="--no-prefix-caching")
    attention_backend: str = knob("auto", "auto: triton on CUDA; on CPU cpu when its kernel is built "
                                          "(make kernels), else torch")
    enforce_eager: bool = knob(False, "CUDA: no CUDA graphs for decode steps")
    cuda_graph_max_batch: int = knob(256, "CUDA: the largest decode batch captured in a CUDA graph")
    overlap_scheduling: bool | str = knob(
        "auto", "do not schedule step N+1 while the device runs step N "
                "(default: overlap on CUDA, where the device runs asynchronously)", flag="--no-overlap")
    scheduling_policy: str = knob("fcfs", "the order in which waiting requests are admitted")
    max_queue_delay: float | None = knob(
        None, "sjf/fair: seconds after which a waiting request goes first (aging)")
    tenant_weights: dict[str, float] | None = knob(None, "fair: share per user (default 1 each)", cli=False)
    admission: str = knob("on-demand", "on-demand (vLLM), reserve prompt+max_tokens (TGI), "
                                       "adaptive reservation (SGLang)")
    max_batch_total_tokens: int | None = knob(
        None, "reserve: tokens all running requests may reserve (default: the KV cache's capacity)")
    max_batch_prefill_tokens: int | None = knob(
        None, "reserve: prompt tokens per prefill step (default: max_num_batched_tokens)")
    waiting_served_ratio: float = knob(
        0.3, "reserve: waiting/running ratio that makes a prefill step worth pausing decodes")
    max_waiting_tokens: int = knob(20, "reserve: decode steps after which waiting requests are prefilled")
    adaptive_init_beta: float = knob(0.7, "adaptive: first guess of the used share of max_tokens")
    scheduling: str = knob("continuous", "static: batch-level static batching (ablation)",
                           choices=["continuous", "static"])
    kv_layout: str = knob("paged", "contiguous: each request reserves max_model_len up front (ablation)",
                          choices=["paged", "contiguous"])
    trace_path: str | None = knob(
        None, "write the step trace (JSONL: tokens by kind, running, waiting, KV) here", flag="--trace")
    num_threads: int | None = knob(None, "CPU threads for torch (default: the cores this process may run on)")
    structured_outputs_backend: str = knob(
        "auto", "the library that compiles structured-output constraints (auto = xgrammar)",
        choices=["auto", "xgrammar"])
    cpu_prepack: bool = knob(True, "CPU: keep linear weights plain instead of prepacked for oneDNN (ablation)",
                             flag="--no-cpu-prepack")

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N]; got {self.device!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy; got {self.load_format!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {self.quantization!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1; got {self.max_model_len}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.scheduling not in ("continuous", "static"):
            raise ValueError(f"scheduling must be continuous or static; got {self.scheduling!r}")
        if self.kv_layout not in ("paged", "contiguous"):
            raise ValueError(f"kv_layout must be paged or contiguous; got {self.kv_layout!r}")
        if self.max_queue_delay is not None and self.max_queue_delay <= 0:
            raise ValueError(f"max_queue_delay must be > 0 seconds; got {self.max_queue_delay}")
        if self.overlap_scheduling not in (True, False, "auto"):
            raise ValueError(f"overlap_scheduling must be True, False or 'auto'; got {self.overlap_scheduling!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1; got {self.num_threads}")
        if self.cuda_graph_max_batch < 1:
            raise ValueError(f"cuda_graph_max_batch must be >= 1; got {self.cuda_graph_max_batch}")
        if self.structured_outputs_backend not in ("auto", "xgrammar"):
            raise ValueError("structured_outputs_backend must be auto or xgrammar; "
                             f"got {self.structured_outputs_backend!r}")
        if self.kv_cache_memory is not None:
            object.__setattr__(self, "kv_cache_memory", parse_size(self.kv_cache_memory))

    def resolve(self) -> EngineConfig:
        """This config with every ``auto`` decided for this machine (the one place that decides).

        device: cuda if available, else cpu. dtype: bfloat16. attention_backend: triton on CUDA when
        triton is installed; on CPU the cpu kernel when it is built and loads, else torch.
        structured_outputs_backend: xgrammar. overlap_scheduling: on CUDA only; on CPU the forward runs synchronously, so overlapping would
        only hand each token out one step later. num_threads: the cores this process may run on (its
        CPU affinity, which a container or taskset narrows).
        Names of registered pieces (attention backend, policy, admission) are checked where they
        are looked up, when the engine builds them.
        """
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        on_cuda = torch.device(device).type == "cuda"
        dtype = "bfloat16" if self.dtype == "auto" else self.dtype
        if dtype == "float16" and not on_cuda:
            raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
        backend = self.attention_backend
        if backend == "auto":
            if on_cuda:
                backend = "triton" if importlib.util.find_spec("triton") is not None else "torch"
            else:
                backend = _auto_cpu_attention_backend(CPU_ATTENTION_LIBRARY)
        overlap = on_cuda if self.overlap_scheduling == "auto" else bool(self.overlap_scheduling)
        structured = "xgrammar" if self.structured_outputs_backend == "auto" else self.structured_outputs_backend
        return dataclasses.replace(self, device=device, dtype=dtype, attention_backend=backend,
                                   overlap_scheduling=overlap, num_threads=self.num_threads or usable_cores(),
                                   structured_outputs_backend=structured)

    @property
    def torch_device(self) -> torch.device:
        """The resolved device as a torch.device."""
        return torch.device(self.resolve().device)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The resolved dtype as a torch.dtype (ValueError for float16 on CPU)."""
        return _DTYPES[self.resolve().dtype]


@functools.cache
@functools.cache
def load_cpu_attention_library(path: Path) -> str | None:
    """Loads the CPU attention kernel's torch ops (once per process); returns why it cannot, else None."""
    if not path.is_file():
        return f"the CPU attention kernel is not built ({path} is missing): run `make kernels` in the source tree"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return f"the CPU attention kernel {path} does not load ({exc}): rebuild it with `make kernels`"
    return None


@functools.cache
def _auto_cpu_attention_backend(path: Path) -> str:
    # cached so the fallback is logged once, however often configs resolve
    reason = load_cpu_attention_library(path)
    if reason is None:
        return "cpu"
    logger.info("attention_backend auto: using torch, since %s", reason)
    return "torch"
