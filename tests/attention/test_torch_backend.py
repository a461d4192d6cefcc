"""TorchAttentionBackend vs a naive per-sequence reference over contiguous K/V."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.attention.backend import get_attention_backend
from tests.attention.paged_reference import run_case
from tests.helpers import make_attn_metadata

torch.set_num_threads(2)
BACKEND = 'torch'


@pytest.mark.parametrize(
    "query_lens,seq_lens",
    [
        ([1], [1]),  # first decode token right after an empty cache
        ([1, 1, 1], [5, 17, 8]),  # decode only, blocks cut at different offsets
        ([7], [7]),  # plain prefill
        ([5], [13]),  # chunked prefill over cached context
        ([3, 1, 6, 1], [3, 9, 20, 4]),  # mixed batch, decodes interleaved with chunks
    ],
)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_matches_reference_fp32(query_lens: list[int], seq_lens: list[int], heads: tuple[int, int]) -> None:
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim=16, block_size=4, dtype=torch.float32)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


@given(
    seqs=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=6
    ),  # (query_len, cached tokens)
    heads=st.sampled_from([(2, 1), (4, 2), (8, 8), (9, 3)]),
    head_dim=st.sampled_from([8, 32]),
    block_size=st.sampled_from([1, 3, 4, 16]),
    seed=st.integers(0, 1000),
)
@settings(max_examples=40, deadline=None)
def test_random_batches_fp32(
    seqs: list[tuple[int, int]], heads: tuple[int, int], head_dim: int, block_size: int, seed: int
) -> None:
    query_lens = [q for q, _ in seqs]
    seq_lens = [q + c for q, c in seqs]
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim, block_size, torch.float32, seed)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


# (query_lens, seq_lens): decodes and chunks over contexts longer than the window, chunks longer than
# the window with no cached context (SDPA's path in the cpu backend), contexts past one key tile
WINDOW_CASES = [([1, 1, 1], [5, 17, 9]), ([5, 1, 12], [13, 3, 12]), ([37, 1], [45, 30]), ([1, 20], [300, 290])]


@pytest.mark.parametrize("query_lens,seq_lens", WINDOW_CASES)
@pytest.mark.parametrize("sliding_window", [1, 4, 7, 200])
@pytest.mark.parametrize("heads", [(4, 2), (6, 1)])
def test_sliding_window_matches_reference(query_lens: list[int], seq_lens: list[int], sliding_window: int,
                                          heads: tuple[int, int]) -> None:
    ours, ref = run_case(query_lens, seq_lens, *heads, head_dim=16, block_size=4, dtype=torch.float32,
                         backend=BACKEND, sliding_window=sliding_window)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


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


def test_sliding_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="sliding_window"):
        run_case([3], [3], 4, 2, 16, 4, torch.float32, backend=BACKEND, sliding_window=0)


def test_bf16_loose() -> None:
    ours, ref = run_case([1, 6, 1, 1], [30, 14, 7, 65], 8, 2, 64, 16, torch.bfloat16)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.double(), ref, atol=3e-2, rtol=3e-2)


def test_writes_new_kv_into_cache_slots() -> None:
    meta = make_attn_metadata([2, 1], [2, 5], [[3], [0, 2]], block_size=4)
    k_cache = torch.zeros(4, 4, 1, 2)
    v_cache = torch.zeros_like(k_cache)
    key = torch.arange(6.0).view(3, 1, 2)
    get_attention_backend().forward(torch.randn(3, 1, 2), key, -key, k_cache, v_cache, meta, 1.0)
    torch.testing.assert_close(k_cache[3, :2], key[:2])  # sequence 0, positions 0-1 -> block 3
    torch.testing.assert_close(k_cache[2, 0], key[2])  # sequence 1, position 4 -> block 2, offset 0
    torch.testing.assert_close(v_cache[2, 0], -key[2])


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        get_attention_backend("nope")
