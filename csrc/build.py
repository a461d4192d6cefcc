"""Compiles a CPU kernel into a torch op library: ``python csrc/build.py OUTPUT.so [SOURCE.cpp]``.

SOURCE defaults to csrc/cpu_attention.cpp. A plain compiler call (no ninja, no Python headers): the
library only registers torch ops, so it needs torch's headers and libraries, taken from the torch this
interpreter imports.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils import cpp_extension

CSRC = Path(__file__).resolve().parent
SOURCE = CSRC / "cpu_attention.cpp"
# The fused element-wise ops reproduce torch's roundings, so no multiply-add may be contracted there.
FP_CONTRACT = {"cpu_fused_ops.cpp": "-ffp-contract=off"}


def compile_command(output: Path, source: Path = SOURCE) -> list[str]:
    """The compiler invocation: portable -O3 (the kernel picks its instruction set at load time)."""
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    lib_dirs = cpp_extension.library_paths()
    return [
        os.environ.get("CXX", "g++"), "-O3", "-std=c++20", "-fPIC", "-shared", "-fopenmp",
        FP_CONTRACT.get(source.name, "-ffp-contract=fast"), f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes,
        str(source), *[f"-L{d}" for d in lib_dirs], *[f"-Wl,-rpath,{d}" for d in lib_dirs],
        "-lc10", "-ltorch_cpu", "-ltorch", "-o", str(output),
    ]


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: python csrc/build.py OUTPUT.so [SOURCE.cpp]")
    output = Path(sys.argv[1]).resolve()
    source = Path(sys.argv[2]).resolve() if len(sys.argv) == 3 else SOURCE
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(".partial.so")  # a failed build never leaves a half-written library
    subprocess.run(compile_command(partial, source), check=True)
    partial.replace(output)


if __name__ == "__main__":
    main()
