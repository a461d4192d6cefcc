"""Resolving an engine configuration: every ``auto`` decided for this machine, in one place (the platform
of the device answers what depends on the hardware)."""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from folovllm import envs
from folovllm.platforms import Platform, platform_for, resolve_device

if TYPE_CHECKING:
    from folovllm.config import EngineConfig

logger = logging.getLogger(__name__)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), the default for ``num_threads``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_config(config: EngineConfig) -> EngineConfig:
    """``config`` with every ``auto`` decided for this machine (the one place that decides).

    device: cuda if available, else cpu. The device's platform (``folovllm/platforms``) decides dtype,
    the attention backend (triton on CUDA when installed; on CPU our kernel where it runs at the CPU's
    tier, else torch) and overlap scheduling (on CUDA only: on CPU the forward runs synchronously, so
    overlapping would only hand each token out one step later). structured_outputs_backend: xgrammar.
    load_quantized: on for a GGUF file where the platform runs its types (``_auto_load_quantized``).
    batch_invariant: on with ``VLLM_BATCH_INVARIANT=1`` too. runner: pooling when convert is embed (and
    convert embed under a pooling runner). num_threads: the cores this process may run on (its CPU
    affinity, which a container or taskset narrows). Names of registered pieces (attention backend,
    policy, admission) are checked where they are looked up, when the engine builds them.
    """
    device = resolve_device(config.device)
    platform = platform_for(device)
    pooling = config.runner == "pooling" or config.convert == "embed"
    dtype = platform.resolve_dtype(config.dtype, prefill_only=pooling)
    backend = platform.auto_attention_backend() if config.attention_backend == "auto" else config.attention_backend
    overlap = platform.asynchronous if config.overlap_scheduling == "auto" else bool(config.overlap_scheduling)
    speculative = config.speculative_config
    if speculative is not None and "disable_by_batch_size" not in speculative:  # where speculation stops paying
        speculative = {**speculative, "disable_by_batch_size": platform.speculation_pause_batch}
    if speculative is not None and overlap:  # proposals read the last token on the host
        if config.overlap_scheduling is True:
            raise ValueError("speculative decoding needs overlap scheduling off; leave it at 'auto' or pass --no-overlap")
        overlap = False
    enforce_eager = config.enforce_eager
    if config.tensor_parallel_size > 1:
        overlap, enforce_eager = _tensor_parallel_settings(config, device, overlap)
    structured = "xgrammar" if config.structured_outputs_backend == "auto" else config.structured_outputs_backend
    batch_invariant = _batch_invariant(config)
    load_quantized = (_auto_load_quantized(config, platform, batch_invariant) if config.load_quantized == "auto"
                      else config.load_quantized)
    return dataclasses.replace(config, runner="pooling" if pooling else "generate",
                               convert="embed" if pooling else "none", device=device, dtype=dtype, attention_backend=backend,
                               overlap_scheduling=overlap, enforce_eager=enforce_eager,
                               load_quantized=load_quantized,
                               num_threads=config.num_threads or usable_cores(),
                               structured_outputs_backend=structured, speculative_config=speculative,
                               batch_invariant=batch_invariant)


def _batch_invariant(config: EngineConfig) -> bool:
    """Whether the engine runs batch-invariant: the knob, or vLLM's ``VLLM_BATCH_INVARIANT=1``. Tensor
    parallelism is refused: a ring all-reduce adds the ranks' parts in an order set by where an element falls
    in the buffer, which the batch's size moves."""
    on = config.batch_invariant or envs.value("VLLM_BATCH_INVARIANT") == "1"
    if on and config.tensor_parallel_size > 1:
        raise ValueError(f"batch-invariant mode with tensor_parallel_size={config.tensor_parallel_size} is not "
                         "supported: the all-reduce's order of adding the ranks' parts depends on the batch's size; "
                         "use one rank (data parallelism keeps each replica invariant)")
    return on


def _auto_load_quantized(config: EngineConfig, platform: Platform, batch_invariant: bool) -> str:
    """on for a GGUF file's own weights (``model`` unset: the default model, a GGUF file; not dummy weights, no
    quantization asked for) where the platform runs them in their types (``Platform.runs_gguf_types``), else
    off: a 4-bit file is never widened to 16-bit where it need not be. Batch-invariant mode takes dense
    weights only, so there it is off."""
    gguf_file = config.model is None or config.model.endswith(".gguf")
    own_weights = config.load_format != "dummy" and config.quantization == "auto"
    return "on" if gguf_file and own_weights and not batch_invariant and platform.runs_gguf_types() else "off"


def _tensor_parallel_settings(config: EngineConfig, device: str, overlap: bool) -> tuple[bool, bool]:
    """(overlap_scheduling, enforce_eager) under tensor parallelism: both off.

    The other ranks learn a step's input tokens from the host, so a token still on rank 0's device
    (overlap) cannot reach them; decode CUDA graphs are not captured with collectives inside.
    """
    platform = platform_for(device)
    if platform.device.index is not None:
        raise ValueError(f"tensor_parallel_size={config.tensor_parallel_size} places rank r on device r; "
                         f"pass device={platform.name!r} instead of {device!r}")
    visible = platform.visible_devices()
    if visible is not None and visible < config.ranks_per_node:
        raise ValueError(f"tensor_parallel_size={config.tensor_parallel_size} over nnodes={config.nnodes} needs "
                         f"{config.ranks_per_node} {platform.name} devices on each node; {visible} are visible")
    if config.overlap_scheduling is True:
        raise ValueError("overlap scheduling does not work with tensor_parallel_size > 1; "
                         "leave overlap_scheduling at 'auto' or pass --no-overlap")
    if overlap:
        logger.info("tensor parallelism: overlap scheduling off (other ranks read input tokens from the host)")
    return False, True
