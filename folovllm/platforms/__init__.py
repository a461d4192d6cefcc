"""The platforms: what each kind of device decides for the engine (``Platform``), and the CPU's tiers.

``platform_for(device)`` is the one place that looks at a device's type; everything else asks the
platform it returns.
"""
from __future__ import annotations

import torch

from folovllm.platforms.cpu import CpuPlatform
from folovllm.platforms.cuda import CudaPlatform
from folovllm.platforms.interface import KernelOps, LinearKernels, Platform

__all__ = ["KernelOps", "LinearKernels", "Platform", "platform_for", "resolve_device", "to_device"]

_PLATFORMS: dict[str, type[Platform]] = {"cpu": CpuPlatform, "cuda": CudaPlatform}


def resolve_device(requested: str) -> str:
    """``auto``: cuda when a CUDA device is visible, else cpu; any other name as given."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def platform_for(device: torch.device | str, batch_invariant: bool = False) -> Platform:
    """The platform of ``device`` (built afresh: it reads the environment's switches as they are now);
    ``batch_invariant``: for an engine in batch-invariant mode (its kernel forms)."""
    device = torch.device(device)
    if device.type not in _PLATFORMS:
        raise ValueError(f"device {device} is not supported; use cpu or cuda[:N]")
    return _PLATFORMS[device.type](device, batch_invariant)


def to_device(values: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Host values as a tensor on ``device`` without making the host wait for the device (on CUDA: pinned
    memory, a non-blocking copy that joins the device's queue)."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)
