"""The CPU platform: its ISA tier, the kernel library at that tier, and what follows from them.

Everything the engine decides differently on a CPU is decided here, once per engine: the dtype ``auto``
means, the attention backend, which kernel multiplies each kind of linear, the platform's own switches
(``FOLOVLLM_CPU_*``, read from ``envs``), where the weights live. The forms a loaded model is compiled into
(fused ops, direct calls, the C++ layer chain) are ``folovllm/compilation/cpu``'s, built from these choices.
"""
from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

import torch

from folovllm import envs
from folovllm.platforms import isa, kernel_library
from folovllm.platforms.allocator import allocator_hint, loaded_allocator
from folovllm.platforms.huge_pages import move_weights_to_huge_pages
from folovllm.platforms.interface import KernelOps, LinearKernels, Platform

logger = logging.getLogger(__name__)

QUANTIZE_LM_HEAD = ("auto", "on", "off")
# FOLOVLLM_CPU_GGUF_A8 auto: int8 activations for GGUF Q4_K/Q6_K parts from this many rows a call on, where
# byte dot products measured faster than bf16 ones (docs/gguf.md; one row reads weights, no faster)
GGUF_A8_MIN_ROWS = 2


@functools.cache
def _log_once(message: str) -> None:
    logger.info(message)


class CpuPlatform(Platform):
    """A CPU at tier ``isa.cpu_tier()``; the kernel library (when built) set to run at that tier."""

    name = "cpu"
    asynchronous = False  # the forward runs on the calling thread: overlapping would only delay each token
    # measured on an AVX2 host (docs/benchmarks.md, "Speculative decoding"): n-gram verification still
    # breaks even at 32 running requests and costs 17 % at 64
    speculation_pause_batch = 32
    distributed_backend = "gloo"
    profiles_memory = False
    captures_graphs = False
    shares_cores = True

    def __init__(self, device: torch.device, batch_invariant: bool = False) -> None:
        super().__init__(device, batch_invariant)
        self.tier = isa.cpu_tier()
        self.kernels_unavailable = kernel_library.set_tier(self.tier)  # why none of ours runs, or None
        kernel_library.set_kernel_switches()
        if self.kernels_unavailable is not None:
            _log_once(f"CPU kernels: plain torch, since {self.kernels_unavailable}")
        self.allocator = loaded_allocator()
        if self.allocator != "tcmalloc":
            _log_once(allocator_hint())
        self.fused_ops = envs.switch("FOLOVLLM_CPU_FUSED_OPS") and kernel_library.has_kernel("fused_ops")
        self.decoder_form = envs.value("FOLOVLLM_CPU_DECODER")
        self.greedy_head = envs.switch("FOLOVLLM_CPU_GREEDY_HEAD")
        self.lora_kernel = envs.switch("FOLOVLLM_CPU_LORA_KERNEL") and kernel_library.has_kernel("lora")
        self.top_k_kernel = envs.switch("FOLOVLLM_CPU_TOP_K_KERNEL") and kernel_library.has_kernel("top_k")

    def kernel_ops(self) -> KernelOps | None:
        if not self.fused_ops:
            return None
        ops = torch.ops.folovllm
        return KernelOps("folovllm", ops.add_rms_norm.default, ops.rms_norm.default, ops.rotary_store_kv.default,
                         ops.silu_and_mul.default)

    def lora_op(self) -> Callable[..., None] | None:
        return torch.ops.folovllm.lora_add.default if self.lora_kernel else None

    def candidate_sampler(self) -> Callable[..., torch.Tensor] | None:
        return torch.ops.folovllm.sample_top_k.default if self.top_k_kernel else None

    def runs_triton(self) -> bool:
        # only under Triton's own interpreter switch (tests): it runs the kernels on CPU tensors, in numpy
        return os.environ.get("TRITON_INTERPRET") == "1"

    def resolve_dtype(self, requested: str, prefill_only: bool = False) -> str:
        """auto: bfloat16 where its matmuls run fast (native bf16 dot products, or our linear kernel, which
        keeps bf16 weights and multiplies in fp32 FMAs), else float32 (torch would emulate bf16 products
        several times slower than its fp32 ones). A prefill-only engine (pooling) below native bf16 takes
        float32: its steps are large matmuls, where oneDNN's fp32 GEMMs beat bf16 weights widened in our
        kernel (1.16x in 4 alternating rounds on an AVX2 host, docs/benchmarks.md "Embeddings"; decode, which
        streams the weights, is where half the bytes pay; AVX-512 without BF16 is unmeasured)."""
        if requested == "float16":
            raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
        fast_bf16 = isa.native_bf16(self.tier) or (
            kernel_library.has_kernel("linear") and envs.value("FOLOVLLM_CPU_LINEAR") in ("auto", "folovllm"))
        if requested == "auto" and prefill_only and not isa.native_bf16(self.tier):
            _log_once(f"dtype auto: float32 for a prefill-only (pooling) engine at tier {self.tier}: no native bf16 "
                      "dot products, and fp32 GEMMs beat bf16 weights widened in registers at prefill")
            return "float32"
        if requested == "auto":
            dtype = "bfloat16" if fast_bf16 else "float32"
            if not fast_bf16:
                _log_once(f"dtype auto: float32, since bfloat16 matmuls at tier {self.tier} would be emulated "
                          f"({self.kernels_unavailable or 'our linear kernel is switched off'})")
            return dtype
        if requested == "bfloat16" and not fast_bf16:
            _log_once(f"bfloat16 at tier {self.tier}: its products are emulated (no native bf16 dot products and "
                      "no linear kernel of ours here); --dtype float32 is several times faster")
        return requested

    def small_matmul_dtype(self, dtype: torch.dtype) -> torch.dtype:
        # below native bf16 dot products torch emulates bf16 matmuls, several times slower than fp32
        return torch.float32 if dtype == torch.bfloat16 and not isa.native_bf16(self.tier) else dtype

    def auto_attention_backend(self) -> str:
        if kernel_library.has_kernel("paged_attention"):
            return "cpu"
        _log_once(f"attention_backend auto: torch, since {self.kernels_unavailable or 'the tier lacks the kernel'}")
        return "torch"

    def linear_kernels(self, dtype: torch.dtype, quantize_lm_head: str = "auto",
                       quantized_linears: bool = False) -> LinearKernels:
        if quantize_lm_head not in QUANTIZE_LM_HEAD:
            raise ValueError(f"quantize_lm_head must be one of {', '.join(QUANTIZE_LM_HEAD)}; got {quantize_lm_head!r}")
        if self.batch_invariant:
            return self._invariant_linear_kernels(dtype, quantize_lm_head, quantized_linears)
        onednn = torch.backends.mkldnn.is_available() and (
            dtype == torch.float32
            or (dtype == torch.bfloat16 and isa.native_bf16(self.tier) and torch.ops.mkldnn._is_mkldnn_bf16_supported()))
        return LinearKernels(dense=self._dense_kernel(dtype, onednn), dense_fallback="onednn" if onednn else "torch",
                             quant=self._quant_kernel(),
                             int4_activations=self._int4_activations(),
                             gguf_a8_rows=self._gguf_a8_rows(),
                             int8_lm_head=quantized_linears if quantize_lm_head == "auto" else quantize_lm_head == "on")

    def _invariant_linear_kernels(self, dtype: torch.dtype, quantize_lm_head: str,
                                  quantized_linears: bool) -> LinearKernels:
        """Batch-invariant mode: our kernel (each output summed along K in one order, whatever the rows) where
        it takes the dtype and has no AMX form here (that form takes calls of 16 rows or more, rounding apart
        from the row-at-a-time one), else torch's GEMM in calls of a fixed row count; quantized weights refused
        (our int4/int8 kernels multiply few rows and many rows in different orders), oneDNN's too (its
        blocking follows the row count)."""
        if quantized_linears or quantize_lm_head == "on":
            raise ValueError("batch-invariant mode takes float weights only: the CPU's int4/int8 kernels sum a few "
                             "rows and many rows in different orders (load a float checkpoint, load_quantized off, "
                             "quantize_lm_head off)")
        choice = envs.value("FOLOVLLM_CPU_LINEAR")
        if choice == "onednn":
            raise ValueError("FOLOVLLM_CPU_LINEAR=onednn cannot run batch-invariant: oneDNN's GEMMs block by the row "
                             "count; use auto, folovllm or torch")
        amx = kernel_library.has_kernel("linear_amx")
        if choice == "folovllm" and amx:
            raise ValueError("FOLOVLLM_CPU_LINEAR=folovllm cannot run batch-invariant on this AMX host: our kernel "
                             "multiplies calls of 16 rows or more with AMX tiles, which round apart from its "
                             "row-at-a-time form; use auto or torch, or FOLOVLLM_CPU_ISA=avx512_bf16")
        ours = dtype == torch.bfloat16 and kernel_library.has_kernel("linear") and not amx
        dense = self._dense_kernel(dtype, onednn=False) if choice != "auto" else "folovllm" if ours else "torch"
        return LinearKernels(dense=dense, dense_fallback="torch", quant=self._quant_kernel(), row_invariant=True)

    def _dense_kernel(self, dtype: torch.dtype, onednn: bool) -> str:
        choice = envs.value("FOLOVLLM_CPU_LINEAR")
        ours = dtype == torch.bfloat16 and kernel_library.has_kernel("linear")
        if choice == "folovllm" and not ours:
            raise RuntimeError(f"FOLOVLLM_CPU_LINEAR=folovllm, but our linear kernel does not take {dtype} at tier "
                               f"{self.tier}")
        if choice == "onednn" and not onednn:
            raise RuntimeError(f"FOLOVLLM_CPU_LINEAR=onednn, but oneDNN does not take {dtype} weights here")
        if choice != "auto":
            return choice
        return "folovllm" if ours else "onednn" if onednn else "torch"

    def _quant_kernel(self) -> str:
        choice = envs.value("FOLOVLLM_QUANT_KERNEL")
        ours = kernel_library.has_kernel("int4")
        if choice == "folovllm" and not ours:
            raise RuntimeError(f"FOLOVLLM_QUANT_KERNEL=folovllm, but our int4/int8 kernels do not run at tier "
                               f"{self.tier}: {self.kernels_unavailable or 'they need avx2'}")
        if choice == "auto":
            if not ours:
                _log_once(f"quantized linears: torch's int4/int8 kernels at tier {self.tier}")
            return "folovllm" if ours else "torch"
        return choice

    @staticmethod
    def _gguf_a8_rows() -> int:
        """The fewest rows a GGUF linear's call takes int8 activations at (0: never); the kernel keeps bf16
        ones wherever the CPU lacks AVX512_VNNI or the tier is below avx512_bf16."""
        return {"off": 0, "on": 1, "auto": GGUF_A8_MIN_ROWS}[envs.value("FOLOVLLM_CPU_GGUF_A8")]

    def _int4_activations(self) -> str:
        return envs.value("FOLOVLLM_INT4_ACTIVATIONS")  # our int8-activation form runs wherever int4 does

    def describe(self) -> dict[str, str]:
        return {"platform": "cpu", "cpu": isa.cpu_model_name(), "isa": self.tier, "isa_host": isa.host_tier(),
                "kernels": "torch" if self.kernels_unavailable else "folovllm", "allocator": self.allocator,
                **self.modes()}

    def place_weights(self, model: torch.nn.Module) -> None:
        if envs.switch("FOLOVLLM_HUGE_PAGE_WEIGHTS"):
            move_weights_to_huge_pages(model)

    def holds_quantized_weights(self) -> bool:
        return True

    def runs_gguf_types(self) -> bool:
        """Where our GGUF kernel runs (every tier from avx2; not under torch's quantized kernels, which take the
        4-bit types alone): a decode step reads each weight once, so the file's 4.5-8.5 bits per weight beat
        16-bit copies of them at one stream (2.4x at 135M; batch 64 and prefill 6 % and 13 % behind, docs/gguf.md)."""
        return kernel_library.has_kernel("gguf") and envs.value("FOLOVLLM_QUANT_KERNEL") in ("auto", "folovllm")
