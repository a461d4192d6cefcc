"""GPTQConfig: a GPTQ checkpoint's ``quantization_config`` (as GPTQModel, AutoGPTQ and transformers write it)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from folovllm.config import env_switch

GPTQ_BITS = (4, 8)
# The zero-point convention: v1 ("gptq", the common one) stores each zero point minus one, v2 stores it as is.
_FORMATS = {"gptq": "v1", "v1": "v1", "gptq_v2": "v2", "v2": "v2"}
# auto: our CPU int4 kernel where it is built and the CPU has AVX512_BF16, else torch's; folovllm / torch:
# that 4-bit kernel (folovllm fails when it cannot run); reference: dequantize-then-matmul (tests, debugging)
KERNELS = ("auto", "folovllm", "torch", "reference")
KERNEL_ENV = "FOLOVLLM_QUANT_KERNEL"
# The activations our int4 kernel multiplies the codes with: bf16 as they come (the default), or int8, rounded
# per row and weight group and multiplied on AVX512_VNNI byte dot products (fewer instructions per code, one
# more rounding); auto: int8 for calls of at least INT4_A8_MIN_ROWS rows (prefill, large batches), where it
# was measured faster, bf16 below (one stream, where it was not)
INT4_ACTIVATIONS = ("bf16", "int8", "auto")
INT4_A8_MIN_ROWS = 16
INT4_ACTIVATIONS_ENV = "FOLOVLLM_INT4_ACTIVATIONS"
# on (default): a decoder layer whose gate_up and down projections both run our int4 kernel calls its MLP as
# one op (gate_up, SiLU-mul, down); off: three calls
INT4_FUSED_MLP_ENV = "FOLOVLLM_INT4_FUSED_MLP"


def kernel_choice() -> str:
    """The quantized-matmul implementation asked for in ``FOLOVLLM_QUANT_KERNEL`` (default "auto")."""
    choice = os.environ.get(KERNEL_ENV, "auto")
    if choice not in KERNELS:
        raise ValueError(f"{KERNEL_ENV}={choice!r}; choose one of {KERNELS}")
    return choice


def int4_activations_choice() -> str:
    """The activations asked for in ``FOLOVLLM_INT4_ACTIVATIONS`` (default "bf16")."""
    choice = os.environ.get(INT4_ACTIVATIONS_ENV, "bf16")
    if choice not in INT4_ACTIVATIONS:
        raise ValueError(f"{INT4_ACTIVATIONS_ENV}={choice!r}; choose one of {INT4_ACTIVATIONS}")
    return choice


def int4_fused_mlp_enabled() -> bool:
    """``FOLOVLLM_INT4_FUSED_MLP`` (on | off, default on)."""
    return env_switch(INT4_FUSED_MLP_ENV)


@dataclass(frozen=True)
class GPTQConfig:
    """The settings that change how a GPTQ checkpoint's tensors read.

    bits: 4 or 8. group_size: input rows sharing one scale and zero point (-1: the whole input).
    desc_act: act-order, rows were quantized in a permuted order and ``g_idx`` maps each row to its
    group. sym: symmetric (zero point fixed at the middle code). zero_offset: 1 for the v1 format,
    which stores every zero point minus one; 0 for v2.
    """

    bits: int
    group_size: int
    desc_act: bool
    sym: bool
    zero_offset: int

    @property
    def pack_factor(self) -> int:
        """Codes per int32."""
        return 32 // self.bits

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> GPTQConfig:
        """Parse and check a ``quantization_config`` dict; ValueError naming the unsupported setting."""
        if "bits" not in config:
            raise ValueError("GPTQ quantization_config lacks 'bits'")
        bits = config["bits"]
        if bits not in GPTQ_BITS:
            raise ValueError(f"GPTQ bits={bits!r} is not supported; supported: {list(GPTQ_BITS)}")
        group_size = int(config.get("group_size", 128))
        if group_size != -1 and group_size < 1:
            raise ValueError(f"GPTQ group_size={group_size} must be -1 (one group) or positive")
        fmt = str(config.get("checkpoint_format") or config.get("format") or "gptq")
        if fmt not in _FORMATS:
            raise ValueError(f"GPTQ checkpoint_format {fmt!r} is not supported; supported: {sorted(_FORMATS)}")
        if config.get("lm_head"):
            raise ValueError("GPTQ checkpoints with a quantized lm_head are not supported (the head stays unquantized)")
        if config.get("dynamic"):
            raise ValueError("GPTQ per-module 'dynamic' overrides are not supported")
        return cls(bits=bits, group_size=group_size, desc_act=bool(config.get("desc_act", False)),
                   sym=bool(config.get("sym", True)), zero_offset=1 if _FORMATS[fmt] == "v1" else 0)
