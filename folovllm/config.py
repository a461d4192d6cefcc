"""Engine configuration: one dataclass of knobs, validated once at start-up."""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
               "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30}
DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 2**30


def parse_size(text: str | int) -> int:
    """Parses a memory size like ``512MiB``, ``2GiB`` or a plain byte count."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"cannot parse memory size {text!r}; use e.g. 512MiB or 2GiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


@dataclass
class EngineConfig:
    """Every engine knob, with vLLM's names where vLLM has one."""

    model: str | None = None  # .gguf file, HF folder, or config for load_format="dummy"; None = default
    dtype: str = "auto"  # auto = bfloat16
    device: str = "auto"  # auto = cuda if available, else cpu
    load_format: str = "auto"  # auto | dummy
    seed: int = 0
    max_model_len: int | None = None  # None = the model's max_position_embeddings
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory: int | str | None = None  # CPU: bytes for the KV cache (default 2 GiB)
    gpu_memory_utilization: float = 0.9  # CUDA: fraction of device memory the engine may use
    num_gpu_blocks_override: int | None = None  # fixes the block count (tests, ablations)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0  # > 0: cap a prompt's chunk per step (chunked prefill only)
    scheduling_policy: str = "fcfs"  # fcfs | priority | sjf | fair
    max_queue_delay: float | None = None  # sjf / fair: seconds after which a request jumps the queue
    tenant_weights: dict[str, float] | None = None  # fair: share per user (default 1 each)
    admission: str = "on-demand"  # on-demand (vLLM) | reserve (TGI) | adaptive (SGLang)
    max_batch_total_tokens: int | None = None  # reserve: default = the KV cache's token capacity
    max_batch_prefill_tokens: int | None = None  # reserve: default = max_num_batched_tokens
    waiting_served_ratio: float = 0.3  # reserve: TGI's default
    max_waiting_tokens: int = 20  # reserve: TGI's default
    adaptive_init_beta: float = 0.7  # adaptive: first guess of the used share of max_tokens
    scheduling: str = "continuous"  # continuous (iteration-level) | static (batch-level ablation)
    kv_layout: str = "paged"  # paged | contiguous (reserve max_model_len per request: ablation)
    trace_path: str | None = None  # write one JSON line per step (the step trace) here
    attention_backend: str = "auto"  # auto (triton on CUDA, torch elsewhere) | torch | triton
    enforce_eager: bool = False  # CUDA: no CUDA graphs for decode steps
    cuda_graph_max_batch: int = 256  # CUDA: largest decode batch captured (ladder 1, 2, 4, 8, 16, 24, ...)
    overlap_scheduling: bool | str = "auto"  # schedule step N+1 while the device runs step N (auto: CUDA)
    num_threads: int | None = None  # CPU threads for torch; None = all cores

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N]; got {self.device!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy; got {self.load_format!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1; got {self.max_model_len}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        from folovllm.core.admission import ADMISSION_MODES
        from folovllm.core.policy import POLICIES

        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(POLICIES)}; "
                             f"got {self.scheduling_policy!r}")
        if self.admission not in ADMISSION_MODES:
            raise ValueError(f"admission must be one of {', '.join(ADMISSION_MODES)}; got {self.admission!r}")
        if self.scheduling not in ("continuous", "static"):
            raise ValueError(f"scheduling must be continuous or static; got {self.scheduling!r}")
        if self.kv_layout not in ("paged", "contiguous"):
            raise ValueError(f"kv_layout must be paged or contiguous; got {self.kv_layout!r}")
        if self.max_queue_delay is not None and self.max_queue_delay <= 0:
            raise ValueError(f"max_queue_delay must be > 0 seconds; got {self.max_queue_delay}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"attention_backend must be auto, torch or triton; got {self.attention_backend!r}")
        if self.overlap_scheduling not in (True, False, "auto"):
            raise ValueError(f"overlap_scheduling must be True, False or 'auto'; got {self.overlap_scheduling!r}")
        if self.cuda_graph_max_batch < 1:
            raise ValueError(f"cuda_graph_max_batch must be >= 1; got {self.cuda_graph_max_batch}")
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_size(self.kv_cache_memory)

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16
        dtype = _DTYPES[self.dtype]
        if dtype == torch.float16 and self.torch_device.type == "cpu":
            raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
        return dtype
