"""The CPU tiers a kernel test runs at: each tier this host has, a test id apiece, the others skipped with
the tier named (an AVX-512 BF16 host runs the avx2 code paths too; an AVX2 host skips the avx512 ones)."""
from __future__ import annotations

import pytest
import torch

from folovllm.platforms import isa, kernel_library

KERNEL_TIERS = ("avx2", "avx512", "avx512_bf16")


def library_missing() -> str | None:
    """Why the kernel library does not run here at all (not built, the none tier or a cap to it), or None."""
    tier = isa.cpu_tier()
    return kernel_library.load() or (None if isa.at_least(tier, "avx2")
                                     else f"the CPU tier is {tier} (FOLOVLLM_CPU_ISA caps it below avx2, or the CPU "
                                          "lacks it): no kernel of ours runs")


def skip_unless_host_has(tier: str) -> None:
    """Skips the calling test, naming the tier, where this host cannot run ``tier``'s code."""
    reason = library_missing()
    if reason is not None:
        pytest.skip(reason)
    host = torch.ops.folovllm.host_tier()
    if not isa.at_least(host, tier):
        pytest.skip(f"this CPU's tier is {host}: it cannot run {tier} code")
    if not isa.at_least(isa.cpu_tier(), tier):
        pytest.skip(f"FOLOVLLM_CPU_ISA caps the tier at {isa.cpu_tier()}, below {tier}")


def skip_unless_kernel(name: str) -> None:
    """Skips the calling test where kernel ``name`` does not run at the library's current tier."""
    skip_unless_host_has("avx2")
    if not kernel_library.has_kernel(name):
        pytest.skip(f"the {name} kernel has no form at tier {kernel_library.tier()}")


def kernel_missing(name: str) -> str | None:
    """Why kernel ``name`` does not run at the engine's tier here (for a module's skip mark), or None."""
    reason = library_missing()
    if reason is None and not kernel_library.has_kernel(name):
        reason = f"the {name} kernel has no form at tier {kernel_library.tier()}"
    return reason
