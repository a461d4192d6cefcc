"""The CUDA platform's kernels in Triton: its op table (``triton_kernel_ops``: fused.py), LoRA's op (lora.py)
and sampling's noise race (sampling.py). Importing any of them imports triton; the kernels run on CPU tensors
under Triton's interpreter (``TRITON_INTERPRET=1`` before triton is first imported), which is how the tests
check them against the torch forms."""
from __future__ import annotations

from folovllm.platforms.interface import KernelOps


def triton_kernel_ops() -> KernelOps:
    """The layers' kernel forms as Triton kernels (platforms/triton_ops/fused.py)."""
    from folovllm.platforms.triton_ops import fused

    return KernelOps("triton", fused.add_rms_norm, fused.rms_norm, fused.rotary_store_kv, fused.silu_and_mul)
