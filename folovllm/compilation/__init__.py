"""A loaded model's faster forms on its platform, compiled from the one model definition.

The model files state each layer's math once (``model/``, every layer in its native torch form); a
platform's compile step switches on what its kernels run, with the same results:

- each ``CustomOp``'s kernel form (fused norms, rotary + KV store, SiLU-mul: ``FOLOVLLM_CPU_FUSED_OPS``);
- the pre-norm decoder layers as direct op calls from Python (``direct.py``), and a decode step's layers
  as one C++ call (``layer_chain.py``), small ones on one team of threads (``FOLOVLLM_CPU_DECODER``:
  modules, direct, chain, team).

The CUDA platform's form is its decode CUDA graphs, captured by the worker once the KV cache exists
(``worker/cuda_graphs.py``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from folovllm.compilation.cpu import compile_cpu_model
from folovllm.platforms import Platform

_COMPILERS: dict[str, Callable[[nn.Module, Any], None]] = {"cpu": compile_cpu_model}


def compile_model(model: nn.Module, platform: Platform) -> None:
    """Switches ``model`` (loaded, weights processed) to ``platform``'s faster forms, in place."""
    compiler = _COMPILERS.get(platform.name)
    if compiler is not None:
        compiler(model, platform)
