"""FoloVLLM's CPU kernel library (csrc/cpu/, built by ``make kernels`` into the package): loaded once per
process as ``torch.ops.folovllm`` and run at the tier the CPU platform sets (``isa.cpu_tier()``).

One build serves every x86-64 CPU: each kernel is compiled for its tier and the library runs those its
current tier allows (``has_kernel``). At the ``none`` tier (and off x86-64) no kernel of it runs: every op
is plain torch.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from folovllm import envs
from folovllm.platforms import isa

LIBRARY = Path(__file__).resolve().parent.parent / "lib" / "libfolovllm_cpu.so"
logger = logging.getLogger(__name__)


@functools.cache
def load(path: Path = LIBRARY) -> str | None:
    """Loads the library (once per process); returns why it cannot, else None."""
    if not path.is_file():
        return f"the CPU kernel library is not built ({path} is missing): run `make kernels` in the source tree"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return f"the CPU kernel library {path} does not load ({exc}): rebuild it with `make kernels`"
    if not hasattr(torch.ops.folovllm, "has_kernel") or not hasattr(torch.ops.folovllm, "kernel_switches"):
        return f"the CPU kernel library {path} is older than this package: rebuild it with `make kernels`"
    tier = isa.cpu_tier()  # from the start at the engine's tier, before any platform sets it
    library_host = torch.ops.folovllm.host_tier()
    torch.ops.folovllm.set_tier(tier if isa.rank(tier) <= isa.rank(library_host) else library_host)
    return None


def set_tier(tier: str) -> str | None:
    """Runs the library's kernels at ``tier`` from now on (the library's own detection bounds it); returns
    why no kernel of it runs there (the ``none`` tier, not built), else None."""
    if not isa.at_least(tier, "avx2"):
        if load() is None:
            torch.ops.folovllm.set_tier("none")
        return f"the CPU tier is {tier}, below the kernels' least (avx2)"
    reason = load()
    if reason is None:
        library_host = torch.ops.folovllm.host_tier()
        torch.ops.folovllm.set_tier(tier if isa.rank(tier) <= isa.rank(library_host) else library_host)
    return reason


def tier() -> str:
    """The tier the library's kernels run at now (``none`` when it is not loaded)."""
    return torch.ops.folovllm.tier() if load() is None else "none"


def has_kernel(name: str) -> bool:
    """Whether kernel ``name`` runs at the library's current tier (False when it is not loaded).

    Names: top_k (every tier); paged_attention, prefill_attention, fused_ops, linear, linear_argmax, int4,
    int4_a8, int8, gguf, lora (avx2 and up); decode_avx512; team (avx512_bf16 and up); linear_amx (the linear
    kernel's AMX form: the amx tier, where the OS grants the tile registers)."""
    return load() is None and bool(torch.ops.folovllm.has_kernel(name))


@contextlib.contextmanager
def running_at(tier_name: str) -> Iterator[None]:
    """The library's kernels at ``tier_name`` inside the block (a test of each tier's code path in one
    process); torch's own kernels keep the tier they started with."""
    previous = tier()
    torch.ops.folovllm.set_tier(tier_name)
    try:
        yield
    finally:
        torch.ops.folovllm.set_tier(previous)


# The kernels' switches (csrc/cpu/isa.h KernelSwitches) and the variables that set them.
KERNEL_SWITCHES = {"fast_decode": "FOLOVLLM_CPU_ATTENTION_FAST_DECODE",
                   "bf16_dot": "FOLOVLLM_CPU_ATTENTION_BF16_DOT",
                   "prefetch": "FOLOVLLM_CPU_ATTENTION_PREFETCH",
                   "chunked_claims": "FOLOVLLM_CPU_ATTENTION_CHUNKED_CLAIMS",
                   "linear_claims": "FOLOVLLM_CPU_LINEAR_CLAIMS"}


def set_kernel_switches() -> None:
    """Sets the kernels' switches from their environment variables (for the whole process, like the tier);
    the CPU platform does it as it is built."""
    if load() is None:
        torch.ops.folovllm.set_kernel_switches(
            **{name: envs.switch(variable) for name, variable in KERNEL_SWITCHES.items()})


@contextlib.contextmanager
def kernel_switches(**switches: bool) -> Iterator[None]:
    """The kernels with the given switches (``KERNEL_SWITCHES``' names) inside the block, the others as they
    are (a test of an optimization's off-path against its on-path in one process)."""
    unknown = set(switches) - set(KERNEL_SWITCHES)
    if unknown:
        raise ValueError(f"unknown kernel switches {sorted(unknown)}; choose among {sorted(KERNEL_SWITCHES)}")
    previous = dict(torch.ops.folovllm.kernel_switches())
    torch.ops.folovllm.set_kernel_switches(**{**previous, **switches})
    try:
        yield
    finally:
        torch.ops.folovllm.set_kernel_switches(**previous)
