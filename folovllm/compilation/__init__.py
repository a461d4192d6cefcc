"""A loaded model's faster forms on its platform, compiled from the one model definition.

The model files state each layer's math once (``model/``, every layer in its native torch form); a
platform's compile step switches on what its kernels run, with the same results:

- each ``CustomOp``'s kernel form (fused norms, rotary + KV store, SiLU-mul) through the platform's op table:
  the C++ library's ops on the CPU (``FOLOVLLM_CPU_FUSED_OPS``), Triton kernels on CUDA
  (``FOLOVLLM_CUDA_FUSED_OPS``);
- the pre-norm decoder layers as direct op calls from Python (``direct.py``), and a decode step's layers
  as one C++ call (``layer_chain.py``), small ones on one team of threads (``FOLOVLLM_CPU_DECODER``:
  modules, direct, chain, team).

On CUDA the kernel forms are the whole compile step; its decode CUDA graphs (the whole step, from the
embedding to the next tokens) are captured by the worker once the KV cache exists (``worker/cuda_graphs.py``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from folovllm.compilation.cpu import compile_cpu_model
from folovllm.compilation.kernel_forms import compile_kernel_forms, use_kernel_forms
from folovllm.platforms import Platform

__all__ = ["compile_model", "use_kernel_forms"]

_COMPILERS: dict[str, Callable[[nn.Module, Any], None]] = {"cpu": compile_cpu_model, "cuda": compile_kernel_forms}


def compile_model(model: nn.Module, platform: Platform) -> None:
    """Switches ``model`` (loaded, weights processed) to ``platform``'s faster forms, in place."""
    compiler = _COMPILERS.get(platform.name)
    if compiler is not None:
        compiler(model, platform)
