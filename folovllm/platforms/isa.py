"""The CPU's instruction-set tier: detected once, capped by ``FOLOVLLM_CPU_ISA``, reported with every figure.

Tiers, lowest first: ``none`` (plain torch: what Arm and unknown CPUs get), ``avx2`` (AVX2 + FMA: most
laptops, desktops and cloud VMs), ``avx512`` (Skylake-SP, Cascade Lake), ``avx512_bf16`` (native bf16 dot
products: Cooper Lake, Zen 4/5), ``amx`` (Sapphire Rapids and later). A tier includes the ones below it.
The cap lowers the tier as ``ONEDNN_MAX_CPU_ISA`` lowers oneDNN's, so any host runs and tests every lower
tier; ``envs.cap_torch_kernels`` passes it on to torch's own kernels (oneDNN, ATen's vectorized ops).
"""
from __future__ import annotations

import functools
import platform as host

import torch

from folovllm import envs

TIERS = ("none", "avx2", "avx512", "avx512_bf16", "amx")


def rank(tier: str) -> int:
    """The tier's place in TIERS; ValueError for an unknown name."""
    if tier not in TIERS:
        raise ValueError(f"unknown CPU tier {tier!r}; use one of {', '.join(TIERS)}")
    return TIERS.index(tier)


def at_least(tier: str, floor: str) -> bool:
    return rank(tier) >= rank(floor)


@functools.cache
def host_tier() -> str:
    """The highest tier this CPU has (``none`` off x86-64)."""
    if host.machine().lower() not in ("x86_64", "amd64"):
        return "none"
    checks = (("avx2", torch.cpu._is_avx2_supported), ("avx512", torch.cpu._is_avx512_supported),
              ("avx512_bf16", torch.cpu._is_avx512_bf16_supported), ("amx", torch.cpu._is_amx_tile_supported))
    tier = "none"
    for name, has in checks:
        if not has():
            break
        tier = name
    return tier


def cpu_tier() -> str:
    """The tier the engine uses: the host's, or ``FOLOVLLM_CPU_ISA`` where that is lower."""
    cap = envs.value("FOLOVLLM_CPU_ISA")
    tier = host_tier()
    return tier if cap is None or rank(cap) >= rank(tier) else cap


def native_bf16(tier: str) -> bool:
    """Whether the tier multiplies bf16 natively (bf16 dot products or AMX tiles); below it bf16 is emulated."""
    return at_least(tier, "avx512_bf16")


@functools.cache
def cpu_model_name() -> str:
    """The CPU's model name as the OS reports it (``/proc/cpuinfo`` on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return host.processor() or host.machine()
