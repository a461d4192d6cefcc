"""A layer with two forms of one computation: plain torch (the reference) and a kernel form.

``forward_native`` is the reference, and what runs on every platform; ``forward_kernel`` calls the platform's
kernel ops (``Platform.kernel_ops``: the C++ library's ops on the CPU, Triton kernels on CUDA) for the same
result, rounding where the torch form rounds. A layer is built in its native form; a platform's compile step
(``folovllm/compilation``) hands it the platform's op table where the layer takes a kernel form
(``takes_kernel_form``). The model files never choose.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from folovllm.platforms import KernelOps


class CustomOp(nn.Module):
    """Subclasses define ``forward_native`` and ``forward_kernel`` with one signature; ``forward_kernel`` calls
    ``self.ops``."""

    ops: KernelOps | None = None  # the platform's op table, set per instance by a compile step (``use_kernel_form``)

    @property
    def kernel_form(self) -> bool:
        return self.ops is not None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.ops is not None:
            return self.forward_kernel(*args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def forward_kernel(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def takes_kernel_form(self) -> bool:
        """Whether this instance's configuration has a kernel form (all of it by default)."""
        return True

    def use_kernel_form(self, ops: KernelOps | None) -> None:
        """The kernel form through ``ops`` (where ``takes_kernel_form``), or the native form (None)."""
        self.ops = ops if ops is not None and self.takes_kernel_form() else None
