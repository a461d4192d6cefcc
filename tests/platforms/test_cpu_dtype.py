"""What ``--dtype auto`` means on a CPU: bfloat16 only where its matmuls run fast (native bf16 dot products,
or our linear kernel), float32 where torch would emulate bf16 products; a prefill-only (pooling) engine
keeps bfloat16 only with native bf16 dot products."""
from __future__ import annotations

import pytest
import torch

from folovllm.platforms import isa, kernel_library
from folovllm.platforms.cpu import CpuPlatform

CPU = torch.device("cpu")


def test_auto_is_bfloat16_where_its_matmuls_are_fast(engine_tier: str) -> None:
    platform = CpuPlatform(CPU)
    fast = isa.native_bf16(platform.tier) or kernel_library.has_kernel("linear")
    assert platform.resolve_dtype("auto") == ("bfloat16" if fast else "float32")
    if engine_tier == "none":  # no kernel of ours, no native bf16: torch would emulate every bf16 product
        assert platform.resolve_dtype("auto") == "float32"
    assert platform.resolve_dtype("bfloat16") == "bfloat16"  # asked for, it is served (and logged if slow)
    assert platform.resolve_dtype("float32") == "float32"


def test_switching_our_linear_kernel_off_takes_bfloat16_off_auto_below_native_bf16(monkeypatch, engine_tier) -> None:
    monkeypatch.setenv("FOLOVLLM_CPU_LINEAR", "torch")
    platform = CpuPlatform(CPU)
    assert platform.resolve_dtype("auto") == ("bfloat16" if isa.native_bf16(platform.tier) else "float32")


def test_prefill_only_engines_take_bfloat16_only_with_native_dot_products(engine_tier: str) -> None:
    platform = CpuPlatform(CPU)
    expected = "bfloat16" if isa.native_bf16(platform.tier) else "float32"
    assert platform.resolve_dtype("auto", prefill_only=True) == expected
    assert platform.resolve_dtype("bfloat16", prefill_only=True) == "bfloat16"


def test_a_pooling_config_resolves_auto_for_prefill(monkeypatch) -> None:
    from folovllm.config import EngineConfig

    native = isa.native_bf16(CpuPlatform(CPU).tier)
    pooling = EngineConfig(model="m", runner="pooling", device="cpu").resolve()
    generate = EngineConfig(model="m", device="cpu").resolve()
    assert pooling.dtype == ("bfloat16" if native else "float32")
    assert generate.dtype == CpuPlatform(CPU).resolve_dtype("auto")


def test_float16_is_refused() -> None:
    with pytest.raises(ValueError, match="float16 is not supported on CPU"):
        CpuPlatform(CPU).resolve_dtype("float16")


def test_small_matmuls_leave_bfloat16_only_where_it_is_emulated(engine_tier: str) -> None:
    platform = CpuPlatform(CPU)
    native = isa.native_bf16(platform.tier)
    assert platform.small_matmul_dtype(torch.bfloat16) == (torch.bfloat16 if native else torch.float32)
    assert platform.small_matmul_dtype(torch.float32) == torch.float32
