"""The CUDA platform: an asynchronous device with Triton kernels (attention, the fused element-wise ops, LoRA,
sampling), CUDA graphs and NCCL."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from folovllm import envs
from folovllm.platforms.interface import KernelOps, LinearKernels, Platform

_TRITON = importlib.util.find_spec("triton") is not None


class CudaPlatform(Platform):
    name = "cuda"
    asynchronous = True
    distributed_backend = "nccl"
    profiles_memory = True
    captures_graphs = True
    shares_cores = False

    def __init__(self, device: torch.device, batch_invariant: bool = False) -> None:
        """``batch_invariant``: torch's CUDA GEMMs and row reductions take fixed-tile Triton forms, process-wide
        (``cuda_invariant.py``); the triton attention backend its own batch-invariant form."""
        super().__init__(device, batch_invariant)
        self.fused_ops = _TRITON and envs.switch("FOLOVLLM_CUDA_FUSED_OPS")
        self.graph_sampling = envs.switch("FOLOVLLM_CUDA_GRAPH_SAMPLING")  # (where sampling_race has a kernel)
        if batch_invariant:
            if importlib.util.find_spec("triton") is None:
                raise ValueError("batch-invariant mode on CUDA runs Triton kernels: install triton")
            from folovllm.platforms import cuda_invariant

            cuda_invariant.enable()

    def resolve_dtype(self, requested: str, prefill_only: bool = False) -> str:
        return "bfloat16" if requested == "auto" else requested

    def auto_attention_backend(self) -> str:
        return "triton" if _TRITON else "torch"

    def linear_kernels(self, dtype: torch.dtype, quantize_lm_head: str = "auto",
                       quantized_linears: bool = False) -> LinearKernels:
        # quantized weights dequantize per call here (no CUDA int4 kernel yet); an int8 head only when asked
        return LinearKernels(dense="torch", quant="reference", int8_lm_head=quantize_lm_head == "on")

    def kernel_ops(self) -> KernelOps | None:
        if not self.fused_ops:
            return None
        from folovllm.platforms.triton_ops import triton_kernel_ops  # imports triton

        return triton_kernel_ops()

    def lora_op(self) -> Callable[..., None] | None:
        if not _TRITON:
            return None
        from folovllm.platforms.triton_ops.lora import lora_add

        return lora_add

    def runs_triton(self) -> bool:
        return _TRITON

    def sampling_race(self) -> Callable[..., torch.Tensor] | None:
        if not _TRITON:
            return None
        from folovllm.platforms.triton_ops.sampling import exponential_race

        return exponential_race

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, pin_memory=True)

    def record_event(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record()
        return event

    def describe(self) -> dict[str, str]:
        return {"platform": "cuda", "gpu": torch.cuda.get_device_name(self.device), **self.modes()}

    def visible_devices(self) -> int | None:
        return torch.cuda.device_count()

    def replica_devices(self, replicas: int, tensor_parallel_size: int) -> list[str]:
        if self.device.index is not None:
            raise ValueError(f"data_parallel_size={replicas} places replica r on cuda:r; pass device='cuda' "
                             f"instead of {str(self.device)!r}")
        if tensor_parallel_size > 1:
            raise ValueError("data parallelism with tensor parallelism is CPU-only for now (each replica's "
                             "ranks would claim the same cuda:0..N-1); use one of them on CUDA")
        if torch.cuda.device_count() < replicas:
            raise ValueError(f"data_parallel_size={replicas} needs that many CUDA devices; "
                             f"{torch.cuda.device_count()} are visible")
        return [f"cuda:{r}" for r in range(replicas)]

    def rank_device(self, local_rank: int) -> torch.device:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device

    def copy_home(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        return host, self.record_event()
