"""Each attention backend's batch-invariant form: a sequence's query rows give the same bits whether they come
as one fresh prompt chunk, as chunks cut anywhere over cached context beside other sequences' rows, or one by
one as decode rows in a batch (the cpu backend at every kernel tier, the torch backend, triton in its
interpreter); the default forms do not (the inverse)."""
from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from folovllm.attention.backend import get_attention_backend
from folovllm.attention.kv_quant import KVCacheFormat, kv_cache_format, write_quantized_kv
from tests.helpers import BlockPool, make_attn_metadata, use_triton_interpreter_without_cuda
from tests.tiers import library_missing

torch.set_num_threads(2)
BLOCK = 4
NOT_BUILT = library_missing()
needs_kernel = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")


class Case:
    """A needle sequence of ``length`` tokens and two other sequences, their K/V already in a paged cache."""

    def __init__(self, length: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 kv_format: KVCacheFormat | None = None, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.head_dim, self.dtype, self.length = heads, kv_heads, head_dim, dtype, length
        pool = BlockPool(256, seed)
        self.lengths = [length, 37, 90]
        self.tables = [pool.grow([], n, BLOCK) for n in self.lengths]
        self.q = [torch.randn(n, heads, head_dim, generator=gen).to(dtype) for n in self.lengths]
        self.k = [torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype) for n in self.lengths]
        self.v = [torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype) for n in self.lengths]
        row = head_dim if kv_format is None else head_dim + 2
        cache_dtype = dtype if kv_format is None else kv_format.code_dtype
        self.k_cache = torch.zeros(256, BLOCK, kv_heads, row, dtype=cache_dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        for table, k, v, n in zip(self.tables, self.k, self.v, self.lengths):
            slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(n)])
            if kv_format is None:
                self.k_cache.view(-1, kv_heads, head_dim)[slots] = k
                self.v_cache.view(-1, kv_heads, head_dim)[slots] = v
            else:
                write_quantized_kv(k, v, self.k_cache, self.v_cache, slots, kv_format)

    def step(self, backend, parts: list[tuple[int, int, int]], window: int | None = None) -> list[torch.Tensor]:
        """One step of ``parts`` (sequence, first row, end row), each part's output rows."""
        meta = make_attn_metadata([e - s for _, s, e in parts], [e for _, _, e in parts],
                                  [self.tables[i] for i, _, _ in parts], BLOCK)
        q, k, v = (torch.cat([x[i][s:e] for i, s, e in parts]) for x in (self.q, self.k, self.v))
        out = backend.forward(q, k, v, self.k_cache, self.v_cache, meta, self.head_dim ** -0.5, window, kv_stored=True)
        out = out.view(-1, self.heads, self.head_dim)
        starts = [0]
        for _, s, e in parts:
            starts.append(starts[-1] + e - s)
        return [out[a:b] for a, b in zip(starts, starts[1:])]

    def needle_layouts(self, backend, window: int | None = None, seed: int = 0) -> list[torch.Tensor]:
        """The needle's rows: one fresh chunk alone; chunks cut at random over cached context beside other
        rows; each row decoded in a batch."""
        rng = random.Random(seed)
        layouts = [self.step(backend, [(0, 0, self.length)], window)[0]]
        cuts = sorted(rng.sample(range(1, self.length), 4))
        rows = []
        for s, e in zip([0, *cuts], [*cuts, self.length]):
            company = [(1, 36, 37), (2, 60, 60 + rng.randrange(1, 20))]
            parts = [*company[:1], (0, s, e), *company[1:]]
            rows.append(self.step(backend, parts, window)[1])
        layouts.append(torch.cat(rows))
        decoded = [self.step(backend, [(2, 89, 90), (0, p, p + 1), (1, 10, 12)], window)[1] for p in range(self.length)]
        layouts.append(torch.cat(decoded))
        return layouts


def assert_all_equal(layouts: list[torch.Tensor]) -> None:
    for other in layouts[1:]:
        assert torch.equal(other, layouts[0]), (other.float() - layouts[0].float()).abs().max()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,head_dim", [((9, 3), 64), ((8, 2), 128), ((4, 2), 32)])  # 32: no AVX-512 fast path
def test_cpu_rows_reduce_alike_in_every_layout(kernel_tier: str, dtype: torch.dtype, heads: tuple[int, int],
                                               head_dim: int) -> None:
    case = Case(150, *heads, head_dim, dtype)
    assert_all_equal(case.needle_layouts(get_attention_backend("cpu", batch_invariant=True)))


@needs_kernel
@pytest.mark.parametrize("window", [None, 37])
def test_cpu_sliding_window_and_quantized_cache(kernel_tier: str, window: int | None) -> None:
    backend = get_attention_backend("cpu", batch_invariant=True)
    assert_all_equal(Case(120, 4, 2, 64, torch.bfloat16).needle_layouts(backend, window, seed=1))
    assert_all_equal(Case(120, 4, 2, 64, torch.float32, kv_cache_format("int8")).needle_layouts(backend, window))


@needs_kernel
def test_cpu_default_form_differs(kernel_tier: str) -> None:
    """The inverse: a fresh chunk goes to the prefill kernel (or SDPA), a chunk over context to SDPA or the
    kernel's multi-row path, a decode row to its own form: the needle's rows differ between layouts."""
    layouts = Case(150, 9, 3, 64, torch.float32).needle_layouts(get_attention_backend("cpu"))
    assert not all(torch.equal(other, layouts[0]) for other in layouts[1:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("window", [None, 30])
def test_torch_rows_reduce_alike_in_every_layout(dtype: torch.dtype, window: int | None) -> None:
    backend = get_attention_backend("torch", batch_invariant=True)
    assert_all_equal(Case(140, 6, 2, 64, dtype).needle_layouts(backend, window))
    assert_all_equal(Case(70, 4, 1, 32, dtype, kv_cache_format("fp8")).needle_layouts(backend, window))


def test_torch_default_form_differs() -> None:
    layouts = Case(140, 6, 2, 64, torch.float32).needle_layouts(get_attention_backend("torch"))
    assert not all(torch.equal(other, layouts[0]) for other in layouts[1:])


def test_a_backend_without_the_form_is_refused(monkeypatch) -> None:
    from folovllm.attention.torch_backend import TorchAttentionBackend

    monkeypatch.setattr(TorchAttentionBackend, "has_batch_invariant_form", False)
    with pytest.raises(ValueError, match="attention backend 'torch' has no batch-invariant form"):
        get_attention_backend("torch", batch_invariant=True)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("window", [None, 21])
def test_triton_rows_reduce_alike_in_every_layout(window: int | None) -> None:
    use_triton_interpreter_without_cuda()
    backend = get_attention_backend("triton", batch_invariant=True)
    assert_all_equal(Case(40, 4, 2, 16, torch.float32).needle_layouts(backend, window))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_default_form_differs() -> None:
    """The inverse: a prompt chunk's query tiles are 64 rows, a decode step's 16, and a windowed row's keys
    start where its tile's first row's window does."""
    use_triton_interpreter_without_cuda()
    layouts = Case(40, 4, 2, 16, torch.float32).needle_layouts(get_attention_backend("triton"), 21)
    assert not all(torch.equal(other, layouts[0]) for other in layouts[1:])
