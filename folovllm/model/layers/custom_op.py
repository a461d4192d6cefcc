"""A layer with two forms of one computation: plain torch (the reference) and a kernel form.

``forward_native`` is the reference, and what runs on every platform; ``forward_kernel`` calls FoloVLLM's
kernel ops (``torch.ops.folovllm``) for the same result, rounding where the torch form rounds. A layer is
built in its native form; a platform's compile step (``folovllm/compilation``) switches the kernel form on
where its kernels run and the layer takes it (``takes_kernel_form``). The model files never choose.
"""
from __future__ import annotations

from typing import Any

from torch import nn


class CustomOp(nn.Module):
    """Subclasses define ``forward_native`` and ``forward_kernel`` with one signature."""

    kernel_form = False  # set per instance by a compile step (``use_kernel_form``)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.kernel_form:
            return self.forward_kernel(*args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def forward_kernel(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def takes_kernel_form(self) -> bool:
        """Whether this instance's configuration has a kernel form (all of it by default)."""
        return True

    def use_kernel_form(self, enabled: bool) -> None:
        """The kernel form on (where ``takes_kernel_form``) or off."""
        self.kernel_form = enabled and self.takes_kernel_form()
