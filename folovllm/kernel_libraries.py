"""The kernel libraries ``make kernels`` builds (csrc/build.py): where each lies, loading it once per
process as torch ops, and whether it runs on this CPU (the reason it does not is logged once)."""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

# The CPU attention kernel's torch op library, built by `make kernels` (csrc/build.py) in a source checkout.
CPU_ATTENTION_LIBRARY = (Path(__file__).resolve().parent.parent / "build" / "cpu_attention"
                         / "libfolovllm_cpu_attention.so")
# The fused element-wise ops of a decoder layer (csrc/cpu_fused_ops.cpp), built beside it.
CPU_FUSED_OPS_LIBRARY = (Path(__file__).resolve().parent.parent / "build" / "cpu_fused_ops"
                         / "libfolovllm_cpu_fused_ops.so")
# The bfloat16 linear kernel (csrc/cpu_bf16_linear.cpp), built beside them.
CPU_BF16_LINEAR_LIBRARY = (Path(__file__).resolve().parent.parent / "build" / "cpu_bf16_linear"
                           / "libfolovllm_cpu_bf16_linear.so")
# Greedy rows' argmax inside the LM head matmul (csrc/cpu_greedy_head.cpp), built beside them.
CPU_GREEDY_HEAD_LIBRARY = (Path(__file__).resolve().parent.parent / "build" / "cpu_greedy_head"
                           / "libfolovllm_cpu_greedy_head.so")
# A decode step's decoder layers in one call (csrc/cpu_decoder_chain.cpp), built beside them.
CPU_DECODER_CHAIN_LIBRARY = (Path(__file__).resolve().parent.parent / "build" / "cpu_decoder_chain"
                             / "libfolovllm_cpu_decoder_chain.so")

logger = logging.getLogger(__name__)


@functools.cache
def load_op_library(path: Path, what: str) -> str | None:
    """Loads a kernel library built by ``make kernels`` (once per process); why it cannot, else None."""
    if not path.is_file():
        return f"{what} is not built ({path} is missing): run `make kernels` in the source tree"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return f"{what} {path} does not load ({exc}): rebuild it with `make kernels`"
    return None


def load_cpu_attention_library(path: Path) -> str | None:
    """Loads the CPU attention kernel's torch ops (once per process); returns why it cannot, else None."""
    return load_op_library(path, "the CPU attention kernel")


def load_cpu_fused_ops_library(path: Path) -> str | None:
    """Loads the fused CPU ops (``torch.ops.folovllm_cpu_fused``, once per process); why it cannot, else None."""
    return load_op_library(path, "the fused CPU ops library")


def _on_unless(switch: str, reason: str | None) -> bool:
    """True when ``reason`` is None; else logs why ``switch`` is off (callers cache: once per process)."""
    if reason is not None:
        logger.info("%s: off, since %s", switch, reason)
    return reason is None


@functools.cache
def cpu_fused_ops_available(path: Path) -> bool:
    """Whether the fused CPU ops load; the reason they do not is logged once per process."""
    return _on_unless("cpu_fused_ops", load_cpu_fused_ops_library(path))


@functools.cache
def cpu_decoder_chain_available(path: Path) -> bool:
    """Whether the decoder layer chain's library loads (after the kernels' libraries whose ops it calls);
    the reason it does not is logged once per process."""
    return _on_unless("cpu_layer_chain", load_op_library(path, "the CPU decoder layer chain"))


def _load_avx512_bf16_library(path: Path, what: str, namespace: str) -> str | None:
    """Loads a kernel library whose ops need AVX-512 BF16 (``torch.ops.<namespace>``, once per process)
    and checks that this CPU runs it; returns why it cannot, else None."""
    reason = load_op_library(path, what)
    if reason is None and not getattr(torch.ops, namespace).available():
        reason = f"this CPU lacks AVX-512 BF16, which {what} needs"
    return reason


def load_cpu_bf16_linear_library(path: Path) -> str | None:
    """Loads the bf16 linear kernel (``torch.ops.folovllm_cpu_linear``); returns why it cannot run here, else None."""
    return _load_avx512_bf16_library(path, "the bf16 linear kernel", "folovllm_cpu_linear")


@functools.cache
def cpu_bf16_linear_available(path: Path) -> bool:
    """Whether the bf16 linear kernel loads and runs here; the reason it does not is logged once per process."""
    return _on_unless("cpu_bf16_linear", load_cpu_bf16_linear_library(path))


def load_cpu_greedy_head_library(path: Path) -> str | None:
    """Loads the greedy LM head kernel (``torch.ops.folovllm_cpu_head``); returns why it cannot run here, else None."""
    return _load_avx512_bf16_library(path, "the greedy LM head kernel", "folovllm_cpu_head")


@functools.cache
def cpu_greedy_head_available(path: Path) -> bool:
    """Whether the greedy LM head kernel loads and runs here; why it does not is logged once per process."""
    return _on_unless("cpu_greedy_head", load_cpu_greedy_head_library(path))


@functools.cache
def auto_cpu_attention_backend(path: Path) -> str:
    # cached so the fallback is logged once, however often configs resolve
    reason = load_cpu_attention_library(path)
    if reason is None:
        return "cpu"
    logger.info("attention_backend auto: using torch, since %s", reason)
    return "torch"
