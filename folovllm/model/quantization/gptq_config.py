"""GPTQConfig: a GPTQ checkpoint's ``quantization_config`` (as GPTQModel, AutoGPTQ and transformers write it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPTQ_BITS = (4, 8)
# The zero-point convention: v1 ("gptq", the common one) stores each zero point minus one, v2 stores it as is.
_FORMATS = {"gptq": "v1", "v1": "v1", "gptq_v2": "v2", "v2": "v2"}


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
