"""Host lists to device tensors without making the host wait for the device.

``torch.tensor(values, device="cuda")`` copies synchronously: the host waits until everything queued
on the device has run, which would undo overlap scheduling. Built in pinned memory and copied with
``non_blocking=True`` instead, the copy simply joins the device's queue (PyTorch keeps the pinned
buffer alive until the copy has run).
"""
from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
