"""Compiles and links the CPU kernel library (``make kernels`` runs it; one object per csrc/cpu/*.cpp).

    python csrc/build.py compile SOURCE.cpp OBJECT.o [TIER]   # also writes OBJECT.d, the headers it read
    python csrc/build.py link LIBRARY.so OBJECT.o ...

A plain compiler call (no ninja, no Python headers): the library only registers torch ops, so it needs
torch's headers and libraries, taken from the torch this interpreter imports. Header dependencies come
from the compiler (-MMD -MP), so the Makefile never lists them. One build serves every x86-64 CPU: the
kernels that need more than the baseline are compiled for their tier by target attributes (isa.h), and each
source of csrc/cpu/tiered/ is compiled once per TIER (avx2, avx512) for that tier's instruction set, into that
tier's namespace (vec.h).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils import cpp_extension

# The fused element-wise ops reproduce torch's roundings, so no multiply-add may be contracted there.
FP_CONTRACT = {"fused_ops.cpp": "-ffp-contract=off"}
# A tiered source's instruction set: the x86-64 level of each tier.
TIERS = {"avx2": "x86-64-v3", "avx512": "x86-64-v4"}


def compile_command(source: Path, output: Path, tier: str | None = None) -> list[str]:
    """The compiler invocation for one source: portable -O3 (or ``tier``'s instruction set, for a tiered
    source), dependencies written beside the object."""
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    tiered = [f"-march={TIERS[tier]}", "-mtune=generic", f"-DFOLO_TIER={tier}"] if tier else []
    return [
        os.environ.get("CXX", "g++"), "-O3", "-std=c++20", "-fPIC", "-fopenmp", "-c", *tiered,
        FP_CONTRACT.get(source.name, "-ffp-contract=fast"), f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes,
        "-MMD", "-MP", "-MF", str(output.with_suffix(".d")), "-MT", str(output),
        str(source), "-o", str(output),
    ]


def link_command(output: Path, objects: list[Path]) -> list[str]:
    lib_dirs = cpp_extension.library_paths()
    return [
        os.environ.get("CXX", "g++"), "-shared", "-fopenmp", *map(str, objects),
        *[f"-L{d}" for d in lib_dirs], *[f"-Wl,-rpath,{d}" for d in lib_dirs],
        "-lc10", "-ltorch_cpu", "-ltorch", "-o", str(output),
    ]


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[1] not in ("compile", "link") or (sys.argv[1] == "compile" and (
            len(sys.argv) > 5 or (len(sys.argv) == 5 and sys.argv[4] not in TIERS))):
        raise SystemExit("usage: python csrc/build.py compile SOURCE.cpp OBJECT.o [avx2|avx512] "
                         "| link LIBRARY.so OBJECT.o ...")
    output = Path(sys.argv[2] if sys.argv[1] == "link" else sys.argv[3]).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.stem + ".partial" + output.suffix)  # a failed step leaves no half file
    if sys.argv[1] == "compile":
        command = compile_command(Path(sys.argv[2]).resolve(), partial, sys.argv[4] if len(sys.argv) == 5 else None)
        command[command.index("-MT") + 1] = sys.argv[3]  # the target as the Makefile names it
    else:
        command = link_command(partial, [Path(p).resolve() for p in sys.argv[3:]])
    subprocess.run(command, check=True)
    partial.replace(output)
    if sys.argv[1] == "compile":
        partial.with_suffix(".d").replace(output.with_suffix(".d"))


if __name__ == "__main__":
    main()
