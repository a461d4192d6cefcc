"""What a kind of device decides for the engine. Code outside ``platforms/`` asks its ``Platform``; it
never tests the device type itself.

``config.resolve()`` asks it for every ``auto`` (dtype, attention backend, overlap); the worker asks it
how to place weights, size the KV cache, copy inputs and outputs, and which kernels the model's linears
use (``LinearKernels``, plain data the linear methods read).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


@dataclass(frozen=True)
class LinearKernels:
    """Which implementation multiplies each kind of linear weight on a platform.

    dense: unquantized weights: ``folovllm`` (our packed kernel, where its tier and the dtype allow),
    ``onednn`` (prepacked for oneDNN) or ``torch`` (plain F.linear); dense_fallback: ``onednn`` or ``torch``,
    for a weight our kernel does not take (its shape). quant: int4/int8 weights: ``folovllm``,
    ``torch`` (torch's CPU kernels) or ``reference`` (dequantize, then matmul). int4_activations: what our
    int4 kernel multiplies the codes with (bf16, int8, auto). int8_lm_head: the LM head held as int8 rows.
    """

    dense: str = "torch"
    dense_fallback: str = "torch"
    quant: str = "reference"
    int4_activations: str = "bf16"
    int8_lm_head: bool = False


class Platform(ABC):
    """One kind of device: its defaults, its kernels, and how the host talks to it."""

    name: ClassVar[str]
    # the device runs queued work while the host goes on, so scheduling step N+1 during step N pays
    asynchronous: ClassVar[bool]
    # speculative decoding pauses above this many running requests unless disable_by_batch_size is given
    # (None: it never pauses, vLLM's default)
    speculation_pause_batch: ClassVar[int | None] = None
    # the collectives' backend between tensor-parallel ranks
    distributed_backend: ClassVar[str]
    # the KV cache's budget is what a profiled forward leaves of device memory (else a given size of RAM)
    profiles_memory: ClassVar[bool]
    # decode steps are captured and replayed as CUDA graphs
    captures_graphs: ClassVar[bool]
    # engines on one machine share its cores (data-parallel replicas split the threads)
    shares_cores: ClassVar[bool]
    # an all plain-greedy step takes its tokens from the LM head's argmax where the head's method offers one
    greedy_head: bool = False
    # LoRA adapters' deltas through the kernel library's lora_add (adapters held in fp32)
    lora_kernel: bool = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @abstractmethod
    def resolve_dtype(self, requested: str, prefill_only: bool = False) -> str:
        """The activations' dtype for ``requested`` (``auto``: this platform's choice; ``prefill_only``: for an
        engine that never decodes, a pooling runner); ValueError for one it cannot run."""

    @abstractmethod
    def auto_attention_backend(self) -> str:
        """The attention backend ``auto`` means here."""

    @abstractmethod
    def linear_kernels(self, dtype: torch.dtype, quantize_lm_head: str, quantized_linears: bool) -> LinearKernels:
        """The kernels for a model of ``dtype``; ``quantize_lm_head`` (auto | on | off) with whether its
        linears are quantized decides the LM head's."""

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """What the start-up log, ``/metrics`` (platform_info) and every result JSON record of this device."""

    def small_matmul_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype of the small side matmuls (LoRA's x·Aᵀ·Bᵀ) of a ``dtype`` model: the model's own, unless the
        platform multiplies it emulated."""
        return dtype

    def set_threads(self, num_threads: int) -> None:
        """Sets the intra-op threads of the calling thread (OpenMP's count is per thread)."""
        torch.set_num_threads(num_threads)

    def visible_devices(self) -> int | None:
        """How many devices of this kind tensor-parallel ranks may each take one of (None: no limit; CPU
        ranks share the cores)."""
        return None

    def replica_devices(self, replicas: int, tensor_parallel_size: int) -> list[str]:
        """The device of each data-parallel replica (ValueError where this platform cannot place them)."""
        return [str(self.device)] * replicas

    def rank_device(self, local_rank: int) -> torch.device:
        """The device a tensor-parallel rank runs on (its local rank on this machine), made current."""
        return self.device

    def copy_home(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Starts copying a device tensor to the host; (the host tensor, an event whose ``synchronize()``
        waits for the copy). A synchronous device's tensors are on the host already."""
        return tensor, None

    def place_weights(self, model: torch.nn.Module) -> None:
        """Moves a loaded model's weights where this platform reads them fastest (nothing by default)."""

    def holds_quantized_weights(self) -> bool:
        """Whether int4/int8 weights run on kernels here (else a quantized model dequantizes every call)."""
        return False

    def runs_gguf_types(self) -> bool:
        """Whether a GGUF file's quantized tensors run here in their own types at least as fast as dequantized
        ones (``load_quantized`` auto for a GGUF file)."""
        return False
