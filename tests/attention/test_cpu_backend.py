"""CpuAttentionBackend (the C++ kernel reading the paged cache in place) vs the fp64 reference and
the torch backend, on ragged batches mixing decodes with prefill chunks, at every CPU tier this host has;
and its build story."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import folovllm.attention.cpu_backend as cpu_backend
from folovllm.attention.backend import get_attention_backend
from folovllm.platforms import kernel_library
from tests.attention.paged_reference import reference_attention, run_case
from tests.helpers import make_attn_metadata, switches
from tests.tiers import library_missing

torch.set_num_threads(2)
BACKEND = 'cpu'

NOT_BUILT = library_missing()
needs_kernel = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")


@needs_kernel
@pytest.mark.parametrize(
    "query_lens,seq_lens",
    [
        ([1], [1]),  # first decode token right after an empty cache
        ([1, 1, 1], [5, 17, 8]),  # decode only, blocks cut at different offsets
        ([7], [7]),  # plain prefill
        ([40], [40]),  # prefill longer than one tile of query rows
        ([5], [13]),  # chunked prefill over cached context
        ([3, 1, 6, 1], [3, 9, 20, 4]),  # mixed batch, decodes interleaved with chunks
        ([1, 20], [300, 290]),  # contexts longer than one key tile
    ],
)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1), (9, 3)])
def test_matches_reference_fp32(query_lens: list[int], seq_lens: list[int], heads: tuple[int, int],
                                kernel_tier: str) -> None:
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim=16, block_size=4, dtype=torch.float32,
                         backend="cpu")
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


@needs_kernel
@given(
    seqs=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 150)), min_size=1, max_size=6),  # (query_len, cached)
    heads=st.sampled_from([(2, 1), (4, 2), (8, 8), (9, 3), (16, 8)]),
    head_dim=st.sampled_from([8, 20, 64]),  # 20: not a multiple of the kernel's vector width
    block_size=st.sampled_from([1, 3, 4, 16]),
    seed=st.integers(0, 1000),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_batches_fp32_match_reference_and_torch(
    seqs: list[tuple[int, int]], heads: tuple[int, int], head_dim: int, block_size: int, seed: int, kernel_tier: str
) -> None:
    query_lens = [q for q, _ in seqs]
    seq_lens = [q + c for q, c in seqs]
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim, block_size, torch.float32, seed, "cpu")
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)
    theirs, _ = run_case(query_lens, seq_lens, *heads, head_dim, block_size, torch.float32, seed, "torch")
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("heads,head_dim", [((9, 3), 64), ((16, 8), 128)])  # SmolLM2's and Qwen3's shapes
def test_bf16_loose(heads: tuple[int, int], head_dim: int, kernel_tier: str) -> None:
    query_lens, seq_lens = [1, 6, 1, 1, 33], [30, 14, 7, 200, 160]
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim, 16, torch.bfloat16, backend="cpu")
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.double(), ref, atol=3e-2, rtol=3e-2)
    theirs, _ = run_case(query_lens, seq_lens, *heads, head_dim, 16, torch.bfloat16, backend="torch")
    torch.testing.assert_close(ours.double(), theirs.double(), atol=3e-2, rtol=3e-2)


# (query_lens, seq_lens): decodes and chunks over contexts longer than the window, chunks longer than
# the window with no cached context (SDPA's path in the cpu backend), contexts past one key tile
WINDOW_CASES = [([1, 1, 1], [5, 17, 9]), ([5, 1, 12], [13, 3, 12]), ([37, 1], [45, 30]), ([1, 20], [300, 290])]


@needs_kernel
@pytest.mark.parametrize("query_lens,seq_lens", WINDOW_CASES)
@pytest.mark.parametrize("sliding_window", [1, 4, 7, 200])
@pytest.mark.parametrize("heads", [(4, 2), (6, 1)])
def test_sliding_window_matches_reference(query_lens: list[int], seq_lens: list[int], sliding_window: int,
                                          heads: tuple[int, int], kernel_tier: str) -> None:
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim=16, block_size=4, dtype=torch.float32,
                         backend=BACKEND, sliding_window=sliding_window)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


@needs_kernel
@given(
    seqs=st.lists(st.tuples(st.integers(1, 30), st.integers(0, 60)), min_size=1, max_size=5),
    sliding_window=st.integers(1, 40),
    block_size=st.sampled_from([1, 3, 16]),
    seed=st.integers(0, 1000),
)
@settings(max_examples=25, deadline=None)
def test_sliding_window_random_batches(seqs: list[tuple[int, int]], sliding_window: int, block_size: int,
                                       seed: int) -> None:
    query_lens, seq_lens = [q for q, _ in seqs], [q + c for q, c in seqs]
    ours, ref = run_case(query_lens, seq_lens, 4, 2, 16, block_size, torch.float32, seed, BACKEND,
                         sliding_window)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


@needs_kernel
def test_sliding_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="sliding_window"):
        run_case([3], [3], 4, 2, 16, 4, torch.float32, backend=BACKEND, sliding_window=0)


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_kernel_computes_fresh_prefill_chunks_too(dtype: torch.dtype, tol: float) -> None:
    # the backend hands chunks without cached context to SDPA; the kernel still computes them when asked
    query_lens, seq_lens = [37, 1, 20], [37, 50, 20]
    gen = torch.Generator().manual_seed(0)
    block_size, num_kv_heads, head_dim = 16, 3, 64
    tables = [[0, 1, 2], [3, 4, 5, 6], [7, 8]]
    k_cache = torch.randn(9, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(9, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    query = torch.randn(sum(query_lens), 9, head_dim, generator=gen).to(dtype)
    meta = make_attn_metadata(query_lens, seq_lens, tables, block_size)
    out = torch.full_like(query, float("nan"))
    torch.ops.folovllm.paged_attention(out, query, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                       meta.query_start_loc, scale=0.125, skip_fresh_prefills=False)
    start = 0
    for q_len, seq_len, table in zip(query_lens, seq_lens, tables):
        k = k_cache[table].flatten(0, 1)[:seq_len]
        v = v_cache[table].flatten(0, 1)[:seq_len]
        ref = reference_attention(query[start:start + q_len], k, v, 0.125)
        torch.testing.assert_close(out[start:start + q_len].flatten(1).double(), ref, atol=tol, rtol=tol)
        start += q_len


@needs_kernel
@pytest.mark.parametrize("sdpa_from", [cpu_backend.SDPA_MIN_ROWS, 0])
@pytest.mark.parametrize("sliding_window", [None, 5, 12])
def test_chunks_over_context_on_either_path_match_reference(
    sdpa_from: int, sliding_window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8+ new rows over context go to gathered K/V + SDPA by default; the kernel computes them with sdpa_from=0
    calls = []
    original = cpu_backend.gather_sequence
    monkeypatch.setattr(cpu_backend, "gather_sequence", lambda *a: calls.append(a) or original(*a))
    query_lens, seq_lens = [8, 1, 7, 30, 20], [50, 9, 20, 30, 61]  # 8 and 20 over context; 7 stays in the kernel
    ours, ref = run_case(query_lens, seq_lens, 9, 3, 16, 4, torch.float32,
                         backend=cpu_backend.CpuAttentionBackend(sdpa_from=sdpa_from), sliding_window=sliding_window)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)
    assert len(calls) == (4 if sdpa_from else 0)  # K and V of the two long chunks over context


@needs_kernel
@pytest.mark.parametrize("option, query_lens, seq_lens", [
    ("prefetch", [1, 1, 1, 4], [300, 129, 9, 40]),
    # many small items on two threads: runs of items or one at a time, the same bits
    ("chunked_claims", [1] * 40 + [5], [3 + 7 * i for i in range(40)] + [30]),
])
def test_kernel_options_give_the_same_output(option: str, query_lens: list[int], seq_lens: list[int],
                                             kernel_tier: str) -> None:
    outputs = {}
    for on in (True, False):
        with kernel_library.kernel_switches(**{option: on}):
            outputs[on], ref = run_case(query_lens, seq_lens, 9, 3, 64, 16, torch.bfloat16, backend=BACKEND)
    assert torch.equal(outputs[True], outputs[False])
    torch.testing.assert_close(outputs[True].double(), ref, atol=3e-2, rtol=3e-2)


@needs_kernel
def test_kernel_rejects_a_block_table_too_short() -> None:
    meta = make_attn_metadata([1], [5], [[0, 1]], block_size=4)
    cache = torch.zeros(2, 4, 1, 8)
    query = torch.zeros(1, 1, 8)
    with pytest.raises(RuntimeError, match="do not fit its block table"):
        torch.ops.folovllm.paged_attention(torch.empty_like(query), query, cache, cache,
                                           meta.block_tables[:, :1], meta.seq_lens, meta.query_start_loc,
                                           scale=1.0, skip_fresh_prefills=False)


@needs_kernel
def test_writes_new_kv_into_cache_slots_and_reads_a_strided_query() -> None:
    meta = make_attn_metadata([2, 1], [2, 5], [[3], [0, 2]], block_size=4)
    k_cache = torch.zeros(4, 4, 1, 2)
    v_cache = torch.zeros_like(k_cache)
    key = torch.arange(6.0).view(3, 1, 2)
    query = torch.randn(3, 2, 2)[:, :1]  # a slice, as q is of a fused projection
    out = get_attention_backend("cpu").forward(query, key, -key, k_cache, v_cache, meta, 1.0)
    torch.testing.assert_close(k_cache[3, :2], key[:2])  # sequence 0, positions 0-1 -> block 3
    torch.testing.assert_close(k_cache[2, 0], key[2])  # sequence 1, position 4 -> block 2, offset 0
    torch.testing.assert_close(v_cache[2, 0], -key[2])
    expected = get_attention_backend("torch").forward(query, key, -key, k_cache, v_cache, meta, 1.0)
    torch.testing.assert_close(out, expected)


def test_explicit_cpu_backend_without_the_kernel_says_how_to_build(monkeypatch) -> None:
    monkeypatch.setattr(kernel_library, "has_kernel", lambda name: False)
    monkeypatch.setattr(kernel_library, "load", lambda: "the CPU kernel library is not built: run `make kernels`")
    with pytest.raises(RuntimeError, match="not built: run `make kernels`"):
        get_attention_backend("cpu")


def test_explicit_cpu_backend_at_the_none_tier_says_so(monkeypatch) -> None:
    monkeypatch.setattr(kernel_library, "has_kernel", lambda name: False)
    monkeypatch.setattr(kernel_library, "load", lambda: None)
    with pytest.raises(RuntimeError, match="below avx2"):
        get_attention_backend("cpu")


def test_a_library_that_does_not_load_is_reported(tmp_path: Path) -> None:
    broken = tmp_path / "broken.so"
    broken.write_text("not a shared library")
    assert "does not load" in kernel_library.load(broken)
    assert "is not built" in kernel_library.load(tmp_path / "missing.so")


@needs_kernel
def test_the_platform_sets_the_kernel_switches_from_the_environment() -> None:
    from folovllm.platforms.cpu import CpuPlatform

    with kernel_library.kernel_switches():  # as they were, after the test
        with switches(CPU_ATTENTION_PREFETCH="off", CPU_ATTENTION_BF16_DOT="off"):
            CpuPlatform(torch.device("cpu"))
        assert dict(torch.ops.folovllm.kernel_switches()) == {
            "fast_decode": True, "bf16_dot": False, "prefetch": False, "chunked_claims": True,
            "linear_claims": True}
    with pytest.raises(ValueError, match="unknown kernel switches"):
        with kernel_library.kernel_switches(decode_prefetch=False):
            pass
