"""The prefill kernel's AMX form (csrc/cpu/attention_prefill_amx.h), on hosts with AMX: against the fp64
reference and the vdpbf16ps form it stands in for (``FOLOVLLM_CPU_ISA=avx512_bf16`` caps the tier below it), each
chunk alone the same bits, any thread count the same bits. Elsewhere every test here is skipped, naming the tier."""
from __future__ import annotations

import math

import pytest
import torch

from folovllm.platforms import kernel_library
from tests.attention.paged_reference import reference_attention
from tests.attention.test_cpu_prefill_kernel import BF16_TOL, strided_qkv
from tests.tiers import kernel_missing

torch.set_num_threads(2)
MISSING = kernel_missing("prefill_attention") or (
    None if torch.ops.folovllm.has_kernel("prefill_attention_amx")
    else f"no AMX form at tier {kernel_library.tier()} (an AMX host runs it)")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}")


def attend(q, k, v, lens: list[int], tier: str | None = None) -> torch.Tensor:
    starts = [sum(lens[:i]) for i in range(len(lens))]
    out = torch.full_like(q, float("nan"))
    if tier is None:
        torch.ops.folovllm.prefill_attention(out, q, k, v, starts, lens, 1 / math.sqrt(q.shape[-1]))
    else:
        with kernel_library.running_at(tier):
            torch.ops.folovllm.prefill_attention(out, q, k, v, starts, lens, 1 / math.sqrt(q.shape[-1]))
    return out


@pytest.mark.parametrize("heads,head_dim,lens", [
    ((9, 3), 64, [1, 7, 15, 16, 17, 63, 64, 65, 130, 300]),  # around the 16-row A tiles and the 64-key tiles
    ((16, 8), 128, [100, 257]),  # two passes of four 16-dim C tiles
    ((4, 4), 64, [3, 200]),
])
def test_form_matches_the_reference_and_the_vdpbf16ps_form(heads: tuple[int, int], head_dim: int,
                                                           lens: list[int]) -> None:
    q, k, v = strided_qkv(sum(lens), *heads, head_dim, seed=sum(lens))
    tiles, dots = attend(q, k, v, lens), attend(q, k, v, lens, tier="avx512_bf16")
    assert not tiles.isnan().any()
    start = 0
    for length in lens:
        rows = slice(start, start + length)
        ref = reference_attention(q[rows], k[rows], v[rows], 1 / math.sqrt(head_dim))
        torch.testing.assert_close(tiles[rows].flatten(1).double(), ref, atol=BF16_TOL, rtol=BF16_TOL)
        start += length
    # the same sums in the same order, rounded apart by the tile unit: a bf16 step now and then
    assert (tiles != dots).sum() <= max(1, tiles.numel() // 100)
    assert ((tiles.float() - dots.float()).abs() <= 2**-7 * dots.float().abs() + 2**-10).all()


def test_each_chunk_alone_and_any_thread_count_give_the_same_bits() -> None:
    lens = [70, 5, 129]
    q, k, v = strided_qkv(sum(lens), 9, 3, 64, seed=1)
    together = attend(q, k, v, lens)
    start = 0
    for length in lens:
        rows = slice(start, start + length)
        assert torch.equal(attend(q[rows], k[rows], v[rows], [length]), together[rows])
        start += length
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            assert torch.equal(attend(q, k, v, lens), together)
    finally:
        torch.set_num_threads(2)


def test_capping_the_tier_leaves_the_form() -> None:
    with kernel_library.running_at("avx512_bf16"):
        assert not torch.ops.folovllm.has_kernel("prefill_attention_amx")
    assert torch.ops.folovllm.has_kernel("prefill_attention_amx")
