"""What a kind of device decides for the engine. Code outside ``platforms/`` asks its ``Platform``; it
never tests the device type itself.

``config.resolve()`` asks it for every ``auto`` (dtype, attention backend, overlap); the worker asks it
how to place weights, size the KV cache, copy inputs and outputs, and which kernels the model's linears
use (``LinearKernels``, plain data the linear methods read).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
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
    int4 kernel multiplies the codes with (bf16, int8, auto). gguf_a8_rows: GGUF linears held packed multiply
    their Q4_K and Q6_K parts with int8 activations (``gguf_gemm_a8``) in calls of at least this many rows (0:
    never). int8_lm_head: the LM head held as int8 rows.
    row_invariant: each row's outputs must not depend on how many rows a call multiplies (batch-invariant
    mode): dense weights on our kernel where it takes them, every other one in calls of a fixed row count.
    """

    dense: str = "torch"
    dense_fallback: str = "torch"
    quant: str = "reference"
    int4_activations: str = "bf16"
    gguf_a8_rows: int = 0
    int8_lm_head: bool = False
    row_invariant: bool = False


@dataclass(frozen=True)
class KernelOps:
    """A platform's kernel forms of a decoder layer's element-wise ops, each with the C++ library's signature
    (csrc/cpu/ops.h), rounding where the torch form rounds; the layers' ``forward_kernel`` calls them.

    add_rms_norm(residual, x, weight, eps) -> out (``residual += x`` in place); rms_norm(x, weight, eps) -> out;
    rotary_store_kv(qkv, num_heads, num_kv_heads, cos, sin, q_weight, k_weight, eps, k_cache, v_cache,
    slot_mapping) -> (q, k, v) with k and v stored at their cache slots (slot -1: nothing);
    silu_and_mul(gate_up) -> silu(gate) * up. source: ``folovllm`` (the C++ library) or ``triton``.
    """

    source: str
    add_rms_norm: Callable[..., torch.Tensor]
    rms_norm: Callable[..., torch.Tensor]
    rotary_store_kv: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[..., torch.Tensor]


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
    # a captured decode step samples inside its graph (where the platform has a counter-keyed draw)
    graph_sampling: bool = False

    def __init__(self, device: torch.device, batch_invariant: bool = False) -> None:
        """``batch_invariant``: the engine's batch-invariant mode: the platform picks the kernel forms whose
        result for a row does not depend on the rest of the batch (or refuses what has none)."""
        self.device = device
        self.batch_invariant = batch_invariant

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

    def modes(self) -> dict[str, str]:
        """The engine-wide modes the platform runs in, for ``describe`` (batch-invariant mode, when on)."""
        return {"batch_invariant": "on"} if self.batch_invariant else {}

    def kernel_ops(self) -> KernelOps | None:
        """The kernel forms the layers switch to at compile time (None: their torch forms)."""
        return None

    def lora_op(self) -> Callable[..., None] | None:
        """LoRA's one call per linear for every adapter of a step, ``lora_add(out, x, row_slot, a, a_start, b,
        pieces, p_start)`` over lora/layers.py's ``kernel_tables`` (adapters in fp32); None: the torch form."""
        return None

    def runs_triton(self) -> bool:
        """Whether Triton kernels (the triton attention backend) run on this device's tensors."""
        return False

    def candidate_sampler(self) -> Callable[..., torch.Tensor] | None:
        """``sample_top_k(logits, k, temperature, top_k, top_p, min_p, seed_keys, counters, seeded, noise) ->
        tokens``: rows sampled among their top k logits in one kernel, by the rules of the sampler's torch form
        (``sample/sampler.py``, ``_sample_candidates``); None: that torch form."""
        return None

    def sampling_race(self) -> Callable[..., torch.Tensor] | None:
        """``race(probs, seeds, counters) -> tokens``: each row's sample drawn with noise that is a function of its
        (seed, counter) alone, in one kernel, so a step replayed in a graph draws what an eager one would; None:
        each row's noise from its ``torch.Generator`` (or the global one)."""
        return None

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host tensor that copies to and from the device without the host waiting (pinned on CUDA)."""
        return torch.zeros(shape, dtype=dtype)

    def record_event(self) -> Any:
        """An event marking the work queued so far (``synchronize()`` waits for it); None on a synchronous device."""
        return None

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
