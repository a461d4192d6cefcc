"""Every ``CustomOp`` of a model switched to a platform's kernel forms (or back to the torch forms)."""
from __future__ import annotations

from torch import nn

from folovllm.model.layers import CustomOp
from folovllm.platforms import KernelOps, Platform


def use_kernel_forms(model: nn.Module, ops: KernelOps | None) -> None:
    """Each layer that takes a kernel form calls ``ops`` from now on; None: every layer its torch form."""
    for module in model.modules():
        if isinstance(module, CustomOp):
            module.use_kernel_form(ops)


def compile_kernel_forms(model: nn.Module, platform: Platform) -> None:
    """A platform whose compile step is its kernel forms alone (CUDA: the Triton ops, ``FOLOVLLM_CUDA_FUSED_OPS``;
    its decode CUDA graphs are captured by the worker once the KV cache exists)."""
    use_kernel_forms(model, platform.kernel_ops())
