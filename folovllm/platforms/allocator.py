"""The host memory allocator under the engine: glibc's malloc, or tcmalloc where one is installed.

A CPU engine step allocates outputs of tens of MB (a 2,048-row gate/up output in fp32 is 25 MB). glibc's
malloc serves blocks that large with fresh ``mmap`` pages and returns them on free, so every step pays a
page fault per 4 KiB of output; tcmalloc keeps freed blocks for the next step. An allocator can only be
chosen before a process starts (``LD_PRELOAD``), so the ``folovllm`` command restarts itself once with
tcmalloc preloaded (``FOLOVLLM_CPU_ALLOCATOR``); an engine built in a Python program of one's own keeps the
allocator its process started with and logs how to preload tcmalloc.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from folovllm import envs

# Debian/Ubuntu (apt: libtcmalloc-minimal4) and RPM distributions' library folders, x86-64 and Arm
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/lib")


def find_tcmalloc(dirs: tuple[str, ...] = LIBRARY_DIRS) -> str | None:
    """The path of an installed tcmalloc library, or None."""
    for folder in dirs:
        for name in TCMALLOC_NAMES:
            path = Path(folder) / name
            if path.exists():
                return str(path)
    return None


def loaded_allocator(maps: str = "/proc/self/maps") -> str:
    """"tcmalloc" when this process has a tcmalloc library mapped, else "system"."""
    try:
        return "tcmalloc" if "tcmalloc" in Path(maps).read_text() else "system"
    except OSError:
        return "system"


def preload_env(env: dict[str, str], library: str | None, has_gpu: bool) -> dict[str, str] | None:
    """The environment to restart the command in, or None to keep the process as it is.

    ``FOLOVLLM_CPU_ALLOCATOR``: tcmalloc preloads ``library`` (an error when none is installed); system keeps
    glibc's; auto preloads it where one is installed and the machine has no NVIDIA GPU (where the engine
    runs on the CPU). None as well when ``library`` is already in ``LD_PRELOAD``: a restart that did not
    take (a library the loader refused) is never repeated.
    """
    choice = envs.value("FOLOVLLM_CPU_ALLOCATOR")
    if choice == "system" or (choice == "auto" and (library is None or has_gpu)):
        return None
    if library is None:
        raise ValueError("FOLOVLLM_CPU_ALLOCATOR=tcmalloc, but no tcmalloc library is installed "
                         f"(looked for {' or '.join(TCMALLOC_NAMES)}; apt: libtcmalloc-minimal4)")
    preloaded = env.get("LD_PRELOAD", "")
    if library in preloaded.replace(":", " ").split():
        return None
    return {**env, "LD_PRELOAD": f"{library}:{preloaded}" if preloaded else library}


def restart_with_preferred_allocator() -> None:
    """For the ``folovllm`` command only, before it does anything: restarts this process with tcmalloc
    preloaded where ``preload_env`` says so (the same interpreter and arguments); returns otherwise."""
    if sys.platform != "linux" or not sys.executable or loaded_allocator() == "tcmalloc":
        return  # (an embedding interpreter may have no executable to restart)
    env = preload_env(dict(os.environ), find_tcmalloc(), has_gpu=Path("/dev/nvidiactl").exists())
    if env is not None:
        os.execve(sys.executable, sys.orig_argv, env)


def allocator_hint() -> str:
    """What a CPU engine on glibc's malloc logs: how to get tcmalloc, or where it comes from."""
    library = find_tcmalloc()
    if library is None:
        return ("allocator: glibc malloc (an installed tcmalloc, apt: libtcmalloc-minimal4, spares the page "
                "faults of large step outputs; the folovllm command then preloads it)")
    return (f"allocator: glibc malloc; LD_PRELOAD={library} before Python starts gives tcmalloc, which keeps "
            "large step outputs' pages (the folovllm command does this itself)")
