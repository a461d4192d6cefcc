"""The CPU kernel's decode forms (single-row items: AVX-512 intrinsics for head_dim 32/64/128 from the avx512
tier, the per-tier form below it and for other head dims) against the fp64 reference and against the kernel's general path
(the ``fast_decode`` switch off): GQA groups that fill, split and overflow a register block, contexts crossing
key-tile and block boundaries, windows."""
from __future__ import annotations

import pytest
import torch

from folovllm.platforms import kernel_library
from tests.attention.paged_reference import reference_attention
from tests.tiers import skip_unless_kernel


@pytest.fixture(autouse=True)
def fast_path_tier(kernel_tier: str) -> None:
    """Each test at every tier the host has that runs the kernel."""
    skip_unless_kernel("paged_attention")

# contexts around the 128-key tile and odd lengths, one mixed batch holding a prefill chunk too
DECODE_BATCHES = [([1], [1]), ([1, 1, 1], [127, 128, 129]), ([1, 1], [257, 33]), ([1, 3, 1], [300, 19, 5])]


def run_kernel(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
               block_size: int, dtype: torch.dtype, sliding_window: int, fast: bool,
               seed: int = 0, bf16_dot: bool = True, prefetch: bool = True,
               chunked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel output [T, Hq*D], fp64 reference) over a shuffled block table."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-s // block_size) for s in seq_lens]
    width = max(per_seq)
    order = torch.randperm(sum(per_seq), generator=gen)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.long)
    k_cache = torch.zeros(sum(per_seq), block_size, num_kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    queries, refs, used = [], [], 0
    scale = head_dim ** -0.5
    for s, (q_len, s_len) in enumerate(zip(query_lens, seq_lens)):
        blocks = order[used:used + per_seq[s]]
        used += per_seq[s]
        tables[s, :per_seq[s]] = blocks
        k = torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        padded = per_seq[s] * block_size
        k_cache[blocks] = torch.cat([k, k.new_zeros(padded - s_len, num_kv_heads, head_dim)]).view(
            per_seq[s], block_size, num_kv_heads, head_dim)
        v_cache[blocks] = torch.cat([v, v.new_zeros(padded - s_len, num_kv_heads, head_dim)]).view(
            per_seq[s], block_size, num_kv_heads, head_dim)
        q = torch.randn(q_len, num_heads, head_dim, generator=gen).to(dtype)
        queries.append(q)
        refs.append(reference_attention(q, k, v, scale, sliding_window or None))
    query = torch.cat(queries)
    out = torch.full_like(query, float("nan"))
    starts = torch.tensor([0, *query_lens]).cumsum(0)
    with kernel_library.kernel_switches(fast_decode=fast, bf16_dot=bf16_dot, prefetch=prefetch,
                                           chunked_claims=chunked):
        torch.ops.folovllm.paged_attention(out, query, k_cache, v_cache, tables, torch.tensor(seq_lens), starts,
                                           scale=scale, sliding_window=sliding_window, skip_fresh_prefills=False)
    return out.flatten(1), torch.cat(refs)


@pytest.mark.parametrize("query_lens,seq_lens", DECODE_BATCHES)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("heads", [(3, 3), (4, 2), (9, 3), (8, 2), (5, 1), (10, 2)])  # group 1, 2, 3, 4, 5
@pytest.mark.parametrize("block_size", [16, 5])
def test_decode_fast_path_fp32_matches_reference(query_lens: list[int], seq_lens: list[int], head_dim: int,
                                                 heads: tuple[int, int], block_size: int) -> None:
    ours, ref = run_kernel(query_lens, seq_lens, *heads, head_dim, block_size, torch.float32, 0, fast=True)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)
    general, _ = run_kernel(query_lens, seq_lens, *heads, head_dim, block_size, torch.float32, 0, fast=False)
    torch.testing.assert_close(ours, general, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (16, 8), (10, 2)])
@pytest.mark.parametrize("sliding_window", [0, 1, 7, 130])
def test_decode_fast_path_bf16_matches_reference_and_general_path(head_dim: int, heads: tuple[int, int],
                                                                  sliding_window: int) -> None:
    query_lens, seq_lens = [1, 1, 1, 4], [300, 129, 1, 40]
    ours, ref = run_kernel(query_lens, seq_lens, *heads, head_dim, 16, torch.bfloat16, sliding_window, fast=True)
    torch.testing.assert_close(ours.double(), ref, atol=3e-2, rtol=3e-2)
    general, _ = run_kernel(query_lens, seq_lens, *heads, head_dim, 16, torch.bfloat16, sliding_window, fast=False)
    # both accumulate in fp32 in different orders; outputs differ by at most a bf16 rounding step
    torch.testing.assert_close(ours.float(), general.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("head_dim", [8, 40, 96, 256])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_decode_other_head_dims_match_the_reference(head_dim: int, dtype: torch.dtype, tol: float) -> None:
    # head dims the AVX-512 form does not take: the per-tier form at whole AVX2 vectors, else the general path
    query_lens, seq_lens = [1, 1, 1, 1], [300, 65, 64, 1]
    ours, ref = run_kernel(query_lens, seq_lens, 12, 4, head_dim, 16, dtype, 0, fast=True)
    torch.testing.assert_close(ours.double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("seq_lens", [[5], [40, 3], [300, 129, 1, 40]])  # on the calling thread .. on a team
def test_decode_output_does_not_depend_on_the_thread_count(seq_lens: list[int]) -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone, _ = run_kernel([1] * len(seq_lens), seq_lens, 9, 3, 64, 16, torch.bfloat16, 0, fast=True)
        torch.set_num_threads(2)
        team, _ = run_kernel([1] * len(seq_lens), seq_lens, 9, 3, 64, 16, torch.bfloat16, 0, fast=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, team)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (10, 2)])
def test_decode_bf16_dot_products_match_the_widened_scores(head_dim: int, heads: tuple[int, int]) -> None:
    # the bf16_dot switch off widens K to fp32 before the dot products; both sum products in fp32
    query_lens, seq_lens = [1, 1, 1], [300, 131, 2]
    dot, ref = run_kernel(query_lens, seq_lens, *heads, head_dim, 16, torch.bfloat16, 0, fast=True)
    torch.testing.assert_close(dot.double(), ref, atol=3e-2, rtol=3e-2)
    widened, _ = run_kernel(query_lens, seq_lens, *heads, head_dim, 16, torch.bfloat16, 0, fast=True, bf16_dot=False)
    torch.testing.assert_close(dot.float(), widened.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype,bf16_dot", [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)])
@pytest.mark.parametrize("head_dim,heads", [(64, (9, 3)), (128, (10, 2)), (64, (5, 1)), (32, (8, 2))])  # 1, 2 or 3 register blocks
@pytest.mark.parametrize("sliding_window", [0, 7, 130])
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_prefetch_leaves_the_output_unchanged(dtype: torch.dtype, bf16_dot: bool, head_dim: int,
                                                      heads: tuple[int, int], sliding_window: int,
                                                      threads: int) -> None:
    # prefetching the next tile (of the same item, or of the next one a thread claimed) only moves loads
    # earlier: the same bits, over items crossing tiles, shorter than one, and a prefill chunk among them
    query_lens, seq_lens = [1, 1, 1, 1, 3, 1, 1], [300, 129, 1, 40, 19, 256, 5]
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        on, ref = run_kernel(query_lens, seq_lens, *heads, head_dim, 16, dtype, sliding_window, fast=True,
                             bf16_dot=bf16_dot, prefetch=True)
        off, _ = run_kernel(query_lens, seq_lens, *heads, head_dim, 16, dtype, sliding_window, fast=True,
                            bf16_dot=bf16_dot, prefetch=False)
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(on, off)
    torch.testing.assert_close(on.double(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("seq_lens", [[40, 3], [300, 129, 1, 40] * 8, [2] * 128])
@pytest.mark.parametrize("prefetch", [True, False])
def test_chunked_claims_leave_the_output_unchanged(seq_lens: list[int], prefetch: bool) -> None:
    # runs of items per claim (chunked) or one at a time, on two threads and on one: the same bits
    saved = torch.get_num_threads()
    try:
        outputs = []
        for threads, chunked in ((2, True), (2, False), (1, True)):
            torch.set_num_threads(threads)
            out, _ = run_kernel([1] * len(seq_lens), seq_lens, 9, 3, 64, 16, torch.bfloat16, 0, fast=True,
                                prefetch=prefetch, chunked=chunked)
            outputs.append(out)
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads", [(9, 3), (8, 4)])
def test_each_kv_head_decodes_as_if_alone(dtype: torch.dtype, heads: tuple[int, int]) -> None:
    # a decode row may read the rows of all its kv heads together (the per-tier form does): each kv head's
    # query heads must get the bits they get from a cache holding that kv head alone
    num_heads, num_kv_heads = heads
    group, head_dim, block_size = num_heads // num_kv_heads, 64, 16
    gen = torch.Generator().manual_seed(3)
    seq_lens = [300, 1, 74, 129]
    width = max(-(-s // block_size) for s in seq_lens)
    tables = torch.randperm(len(seq_lens) * width, generator=gen).view(len(seq_lens), width)
    k_cache = torch.randn(len(seq_lens) * width, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=gen).to(dtype)
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype)
    starts = torch.arange(len(seq_lens) + 1)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(q, float("nan"))
        torch.ops.folovllm.paged_attention(out, q, k, v, tables, torch.tensor(seq_lens), starts,
                                           scale=head_dim ** -0.5, skip_fresh_prefills=False)
        return out

    together = attend(query, k_cache, v_cache)
    for g in range(num_kv_heads):
        heads_of_g = slice(g * group, (g + 1) * group)
        alone = attend(query[:, heads_of_g].contiguous(), k_cache[:, :, g:g + 1].contiguous(),
                       v_cache[:, :, g:g + 1].contiguous())
        assert torch.equal(together[:, heads_of_g], alone)
