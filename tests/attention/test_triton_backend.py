"""Triton attention kernels vs an fp64 reference: on CUDA when present, else through Triton's interpreter.

Shapes stay small: on CPU every Triton program runs in Python (numpy), one program at a time.
"""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import (
    BlockPool,
    make_attn_metadata,
    use_triton_interpreter_without_cuda,
)

if importlib.util.find_spec("triton") is None:  # not importorskip: triton must not be imported yet
    pytest.skip("triton is not installed (the test extra pins it on x86-64 Linux)", allow_module_level=True)
use_triton_interpreter_without_cuda()  # before the kernels module is imported anywhere

from folovllm.attention import triton_kernels  # noqa: E402
from folovllm.attention.backend import (  # noqa: E402
    ATTENTION_BACKENDS,
    attention_backend_names,
    get_attention_backend,
)
from folovllm.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from folovllm.config import EngineConfig  # noqa: E402
from tests.attention.paged_reference import reference_attention  # noqa: E402
from tests.engine.conftest import tiny_llama_dir  # noqa: E402, F401  (the fixture)

torch.set_num_threads(2)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def build_case(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int,
               head_dim: int, block_size: int, dtype: torch.dtype, seed: int = 0, poison: bool = False,
               sliding_window: int | None = None):
    """A paged cache holding each sequence's earlier context, this step's q/k/v, and the metadata.

    With ``poison`` every cache slot that no sequence owns (and the rest of its last block) holds NaN,
    so reading past a sequence's end shows up in the output.
    """
    gen = torch.Generator().manual_seed(seed)
    pool = BlockPool(num_blocks=sum(-(-s // block_size) for s in seq_lens) + 3, seed=seed)
    fill = float("nan") if poison else 0.0
    k_cache = torch.full((len(pool.free), block_size, num_kv_heads, head_dim), fill, dtype=dtype)
    v_cache = k_cache.clone()
    tables, contexts = [], []
    for q_len, s_len in zip(query_lens, seq_lens):
        table = pool.grow([], s_len, block_size)
        k = torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        for pos in range(s_len - q_len):
            blk, off = table[pos // block_size], pos % block_size
            k_cache[blk, off], v_cache[blk, off] = k[pos], v[pos]
        tables.append(table)
        contexts.append((k, v))
    queries = [torch.randn(n, num_heads, head_dim, generator=gen).to(dtype) for n in query_lens]
    new_k = torch.cat([k[s - n:] for (k, _), n, s in zip(contexts, query_lens, seq_lens)])
    new_v = torch.cat([v[s - n:] for (_, v), n, s in zip(contexts, query_lens, seq_lens)])
    meta = make_attn_metadata(query_lens, seq_lens, tables, block_size, device=DEVICE)
    scale = 1 / math.sqrt(head_dim)
    ref = torch.cat([reference_attention(q, k, v, scale, sliding_window) for q, (k, v) in zip(queries, contexts)])
    on = dict(device=DEVICE)
    return (torch.cat(queries).to(**on), new_k.to(**on), new_v.to(**on), k_cache.to(**on),
            v_cache.to(**on), meta, scale, ref)


def run_backend(query_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype,
                seed: int = 0, poison: bool = False,
                sliding_window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v, k_cache, v_cache, meta, scale, ref = build_case(
        query_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed, poison, sliding_window)
    ours = get_attention_backend("triton").forward(q, k, v, k_cache, v_cache, meta, scale, sliding_window)
    return ours.cpu(), ref


CASES = [
    ([1], [1]),  # first decode right after the prompt's single token
    ([1, 1, 1], [5, 17, 8]),  # decode only, blocks cut at different offsets
    ([7], [7]),  # plain prefill
    ([5], [13]),  # chunked prefill over cached context
    ([3, 1, 6, 1], [3, 9, 20, 4]),  # decodes interleaved with chunks
    ([37, 1, 2], [41, 33, 2]),  # a chunk longer than one query tile
]


@pytest.mark.parametrize("query_lens,seq_lens", CASES)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 2)])  # GQA group 1, 2, 3
@pytest.mark.parametrize("block_size", [4, 16])
def test_matches_reference_fp32(query_lens, seq_lens, heads, block_size) -> None:
    ours, ref = run_backend(query_lens, seq_lens, *heads, 16, block_size, torch.float32)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


@given(
    seqs=st.lists(st.tuples(st.integers(1, 24), st.integers(0, 30)), min_size=1, max_size=4),
    heads=st.sampled_from([(2, 1), (4, 2), (9, 3)]),
    head_dim=st.sampled_from([16, 32]),
    block_size=st.sampled_from([1, 3, 4, 16]),
    seed=st.integers(0, 1000),
)
@settings(max_examples=15, deadline=None)
def test_random_batches_fp32(seqs, heads, head_dim, block_size, seed) -> None:
    query_lens = [q for q, _ in seqs]
    seq_lens = [q + c for q, c in seqs]
    ours, ref = run_backend(query_lens, seq_lens, *heads, head_dim, block_size, torch.float32, seed)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,head_dim", [((8, 2), 64), ((9, 3), 64), ((16, 8), 128)])
def test_bf16_loose(heads, head_dim) -> None:
    ours, ref = run_backend([1, 6, 1, 1], [30, 14, 7, 65], *heads, head_dim, 16, torch.bfloat16)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.double(), ref, atol=3e-2, rtol=3e-2)


# (query_lens, seq_lens): decodes and chunks over contexts longer than the window, a chunk longer
# than the window with no cached context, and one longer than a query tile
WINDOW_CASES = [([1, 1, 1], [5, 17, 9]), ([5, 1, 12], [13, 3, 12]), ([37, 1], [45, 30])]


@pytest.mark.parametrize("query_lens,seq_lens", WINDOW_CASES)
@pytest.mark.parametrize("sliding_window", [1, 4, 7])
def test_sliding_window_matches_reference(query_lens, seq_lens, sliding_window) -> None:
    ours, ref = run_backend(query_lens, seq_lens, 4, 2, 16, 4, torch.float32, poison=True,
                            sliding_window=sliding_window)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


def test_reads_nothing_past_a_sequence_and_writes_every_output() -> None:
    q, k, v, k_cache, v_cache, meta, scale, ref = build_case(
        [1, 5, 1], [6, 11, 3], 6, 2, 16, 4, torch.float32, poison=True)
    triton_kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.full_like(q, float("nan"))
    triton_kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                   meta.query_start_loc, scale, out=out)
    torch.testing.assert_close(out.cpu().flatten(1).double(), ref, atol=1e-5, rtol=1e-5)


# (query_lens, seq_lens) of decode-only batches: contexts cut at block edges, one token, a context shorter
# than a range (its later ranges see no key), and a padding row (seq_len 0)
SPLIT_CASES = [([1, 1, 1], [5, 17, 64]), ([1], [1]), ([1, 1], [130, 3])]


@pytest.mark.parametrize("query_lens,seq_lens", SPLIT_CASES)
@pytest.mark.parametrize("num_splits", [2, 3, 7])
@pytest.mark.parametrize("heads", [(4, 2), (6, 2)])
def test_decode_split_over_the_context_matches_reference(query_lens, seq_lens, num_splits, heads) -> None:
    q, k, v, k_cache, v_cache, meta, scale, ref = build_case(query_lens, seq_lens, *heads, 16, 4, torch.float32,
                                                             poison=True)
    triton_kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = triton_kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                         meta.query_start_loc, scale, num_splits=num_splits)
    torch.testing.assert_close(out.cpu().flatten(1).double(), ref, atol=1e-5, rtol=1e-5)


def test_split_decode_leaves_its_tickets_zero_for_the_next_launch() -> None:
    """The ranges merge in one launch through tickets the caller keeps: zero again after each launch, so a
    second launch (a graph's next replay) merges as the first did."""
    q, k, v, k_cache, v_cache, meta, scale, ref = build_case([1, 1], [30, 70], 6, 2, 16, 4, torch.float32)
    triton_kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    tickets = triton_kernels.DecodeTickets()
    for _ in range(2):
        out = triton_kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                             meta.query_start_loc, scale, num_splits=4, tickets=tickets)
        torch.testing.assert_close(out.cpu().flatten(1).double(), ref, atol=1e-5, rtol=1e-5)
        assert not tickets.get(4, q.device).any()


@pytest.mark.parametrize("sliding_window", [1, 7, 40])
def test_decode_split_with_a_sliding_window(sliding_window: int) -> None:
    q, k, v, k_cache, v_cache, meta, scale, ref = build_case([1, 1], [9, 70], 4, 2, 16, 4, torch.float32,
                                                             poison=True, sliding_window=sliding_window)
    triton_kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = triton_kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                         meta.query_start_loc, scale, sliding_window=sliding_window, num_splits=4)
    torch.testing.assert_close(out.cpu().flatten(1).double(), ref, atol=1e-5, rtol=1e-5)


def test_split_decode_padding_rows_output_zeros() -> None:
    """A CUDA graph's spare rows (seq_len 0) see no key in any range: zeros, not NaN."""
    q, k, v, k_cache, v_cache, meta, scale, ref = build_case([1, 1], [9, 4], 4, 2, 16, 4, torch.float32)
    triton_kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    q = torch.cat([q, torch.randn(2, 4, 16, device=DEVICE)])
    seq_lens = torch.cat([meta.seq_lens, torch.zeros(2, dtype=torch.int64, device=DEVICE)])
    tables = torch.cat([meta.block_tables, meta.block_tables.new_zeros(2, meta.block_tables.shape[1])])
    out = triton_kernels.paged_attention(q, k_cache, v_cache, tables, seq_lens, torch.arange(5, device=DEVICE),
                                         scale, num_splits=3).cpu()
    torch.testing.assert_close(out[:2].flatten(1).double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))


def test_the_split_switch_leaves_the_output_unchanged(monkeypatch) -> None:
    """FOLOVLLM_TRITON_SPLIT_DECODE=off: one program per sequence and KV head; on: the context split (forced into
    ranges here, as a GPU with idle SMs would split it). The same attention, to fp32's rounding of the sums."""
    from tests.helpers import switches

    monkeypatch.setattr(triton_kernels, "decode_splits", lambda *shape: 3)
    outputs = {}
    for value in ("on", "off"):
        with switches(TRITON_SPLIT_DECODE=value):
            backend = get_attention_backend("triton")
        q, k, v, k_cache, v_cache, meta, scale, ref = build_case([1, 1, 1], [40, 9, 70], 4, 2, 16, 4, torch.float32)
        outputs[value] = backend.forward(q, k, v, k_cache, v_cache, meta, scale).cpu()
        torch.testing.assert_close(outputs[value].double(), ref, atol=1e-5, rtol=1e-5)
    assert backend._num_splits == 1
    torch.testing.assert_close(outputs["on"], outputs["off"], atol=1e-6, rtol=1e-5)


def test_decode_splits_fill_the_gpu_from_shapes_alone() -> None:
    from folovllm.attention.triton_decode import MAX_SPLITS, MIN_SPLIT_KEYS, decode_splits

    assert decode_splits(1, 8, 4096, 132) == 4096 // MIN_SPLIT_KEYS  # one stream: ranges of the shortest length
    assert decode_splits(1, 2, 1 << 20, 132) == MAX_SPLITS
    assert decode_splits(128, 8, 4096, 132) == 1  # a large batch fills the GPU by itself
    assert decode_splits(4, 8, 4096, 132) == 9  # 2 x 132 programs over 32 (sequence, KV head) pairs
    assert decode_splits(1, 8, 100, 132) == 1  # a short table: no range would be long enough


def test_store_kv_skips_negative_slots() -> None:
    k_cache = torch.full((3, 4, 2, 16), -7.0, device=DEVICE)
    v_cache = k_cache.clone()
    key = torch.randn(3, 2, 16, device=DEVICE)
    triton_kernels.store_kv(key, -key, k_cache, v_cache, torch.tensor([5, -1, 8], device=DEVICE))
    expected = torch.full_like(k_cache, -7.0).view(12, 2, 16)
    expected[5], expected[8] = key[0], key[2]
    torch.testing.assert_close(k_cache.view(12, 2, 16), expected)
    expected[5], expected[8] = -key[0], -key[2]
    torch.testing.assert_close(v_cache.view(12, 2, 16), expected)


def test_store_kv_reads_strided_views() -> None:
    fused = torch.randn(2, 3 * 32, device=DEVICE)  # like a qkv projection split into q, k, v
    _, key, value = fused.split(32, dim=-1)
    key, value = key.view(2, 2, 16), value.view(2, 2, 16)
    k_cache = torch.zeros(1, 4, 2, 16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    triton_kernels.store_kv(key, value, k_cache, v_cache, torch.tensor([2, 0], device=DEVICE))
    torch.testing.assert_close(k_cache[0, [2, 0]], key)
    torch.testing.assert_close(v_cache[0, [2, 0]], value)


def test_padding_sequences_output_zeros_and_leave_the_rest_alone() -> None:
    """CUDA-graph padding: extra decode rows with slot -1 and seq_len 0."""
    q, k, v, k_cache, v_cache, meta, scale, ref = build_case(
        [1, 1], [9, 4], 4, 2, 16, 4, torch.float32, poison=True)
    pad = 3
    q = torch.cat([q, torch.randn(pad, 4, 16, device=DEVICE)])
    k, v = torch.cat([k, torch.randn(pad, 2, 16, device=DEVICE)]), torch.cat([v, v[:1].expand(pad, 2, 16)])
    meta.slot_mapping = torch.cat([meta.slot_mapping, torch.full((pad,), -1, device=DEVICE)])
    meta.query_start_loc = torch.arange(2 + pad + 1, device=DEVICE)
    meta.seq_lens = torch.cat([meta.seq_lens, torch.zeros(pad, dtype=torch.int64, device=DEVICE)])
    tables = meta.block_tables
    meta.block_tables = torch.cat([tables, tables.new_zeros(pad, tables.shape[1])])
    cache_before = k_cache.clone()
    out = get_attention_backend("triton").forward(q, k, v, k_cache, v_cache, meta, scale).cpu()
    torch.testing.assert_close(out[:2].double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))
    written = meta.slot_mapping[:2].cpu()
    unchanged = torch.ones(k_cache.shape[0] * k_cache.shape[1], dtype=torch.bool)
    unchanged[written] = False
    before, after = cache_before.view(-1, 2, 16)[unchanged], k_cache.view(-1, 2, 16)[unchanged]
    assert torch.equal(before.isnan(), after.isnan()) and torch.equal(before.nan_to_num(), after.nan_to_num())


def test_rejects_head_dims_the_kernel_does_not_tile() -> None:
    q, k, v, k_cache, v_cache, meta, scale, _ = build_case([2], [2], 2, 1, 16, 4, torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        get_attention_backend("triton").forward(q[..., :12], k[..., :12], v[..., :12], k_cache[..., :12],
                                                v_cache[..., :12], meta, scale)


def test_backend_names() -> None:
    with pytest.raises(ValueError, match=r"\['cpu', 'torch', 'triton'\]"):
        get_attention_backend("nope")
    assert attention_backend_names() == ["cpu", "torch", "triton"]
    assert EngineConfig(device="cpu").resolve().attention_backend in ("cpu", "torch")  # never triton on CPU
    assert isinstance(get_attention_backend("triton"), TritonAttentionBackend)


@pytest.mark.gpu
@needs_cuda
def test_qwen3_shapes_on_cuda() -> None:
    """Real model shapes, long contexts and big chunks: too slow for the interpreter."""
    assert not triton_kernels.is_interpreted()
    query_lens, seq_lens = [1] * 6 + [300, 128], [1, 700, 1500, 16, 17, 33, 812, 128]
    ours, ref = run_backend(query_lens, seq_lens, 16, 8, 128, 16, torch.bfloat16)
    torch.testing.assert_close(ours.double(), ref, atol=3e-2, rtol=3e-2)
    ours, ref = run_backend(query_lens, seq_lens, 9, 3, 64, 16, torch.float32, poison=True)
    torch.testing.assert_close(ours.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@needs_cuda
def test_new_batch_sizes_compile_no_new_kernel_variant() -> None:
    """A step's sequence count and block-table width vary while serving; a kernel variant compiled for a
    new value class (1, a multiple of 16, other) would stall that step for about a second."""
    from folovllm.attention import triton_decode

    kernels = (triton_kernels._paged_attention_kernel, triton_decode._decode_split_kernel)

    def variants() -> int:  # compiled attention kernels, over devices (Triton 3.x's per-device caches)
        return sum(len(caches[0]) for kernel in kernels for caches in kernel.device_caches.values())

    shapes = [([7], [7]), ([5, 3, 9], [37, 3, 260]), ([4] * 16, [4] * 16), ([9] * 17, [500] * 17)]
    for form, new_tokens in (("prefill", None), ("decode", 1)):
        counts = []
        for query_lens, seq_lens in shapes:
            query_lens = query_lens if new_tokens is None else [new_tokens] * len(query_lens)
            ours, ref = run_backend(query_lens, seq_lens, 16, 8, 128, 16, torch.bfloat16)
            torch.testing.assert_close(ours.double(), ref, atol=3e-2, rtol=3e-2)
            counts.append(variants())
        assert counts[1:] == counts[:1] * (len(shapes) - 1), (form, counts)


def test_engine_greedy_tokens_match_the_torch_backend(tiny_llama_dir) -> None:  # noqa: F811
    from folovllm import SamplingParams
    from tests.engine.conftest import make_llm

    prompts = [[5, 9, 200, 31, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [400]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        # chunks of 8 tokens: prefill over cached context, mixed prefill + decode steps
        llm = make_llm(tiny_llama_dir, attention_backend=backend, max_num_batched_tokens=8,
                       device=DEVICE.type)
        assert type(llm.llm_engine.model.model.layers[0].self_attn.backend) is ATTENTION_BACKENDS.get(backend)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outputs[backend] = [o.outputs[0].token_ids for o in outs]
    assert outputs["triton"] == outputs["torch"]
