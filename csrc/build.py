"""Compiles the CPU attention kernel into a torch op library: ``python csrc/build.py OUTPUT.so``.

A plain compiler call (no ninja, no Python headers): the library only registers torch ops, so it
needs torch's headers and libraries, taken from the torch this interpreter imports.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils import cpp_extension

SOURCE = Path(__file__).resolve().parent / "cpu_attention.cpp"


def compile_command(output: Path) -> list[str]:
    """The compiler invocation: portable -O3 (the kernel picks its instruction set at load time)."""
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    lib_dirs = cpp_extension.library_paths()
    return [
        os.environ.get("CXX", "g++"), "-O3", "-std=c++20", "-fPIC", "-shared", "-fopenmp",
        "-ffp-contract=fast", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, str(SOURCE),
        *[f"-L{d}" for d in lib_dirs], *[f"-Wl,-rpath,{d}" for d in lib_dirs],
        "-lc10", "-ltorch_cpu", "-ltorch", "-o", str(output),
    ]


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python csrc/build.py OUTPUT.so")
    output = Path(sys.argv[1]).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(".partial.so")  # a failed build never leaves a half-written library
    subprocess.run(compile_command(partial), check=True)
    partial.replace(output)


if __name__ == "__main__":
    main()
