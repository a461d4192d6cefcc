"""The kernel library's ``gguf_pack`` (csrc/cpu/gguf_pack.cpp): a GGUF tensor's file blocks packed for gguf_gemm,
byte for byte numpy's ``pack_gguf`` (the layout's readable form) for every packable type, any number of column
blocks and threads, random and real blocks; a load packs with it, and ``FOLOVLLM_GGUF_FAST_LOAD`` off (numpy)
gives the same weights."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm import envs
from folovllm.model.loader import default_model_path
from folovllm.model.quantization import gguf_native
from folovllm.model.quantization.gguf_native import LAYOUTS, GGUFWeight, pack_gguf, packable, packed_bytes
from folovllm.platforms import kernel_library
from tests.model.quant.gguf_files import PACKED_TYPES, Q, random_blocks

NOT_LOADED = kernel_library.load()
pytestmark = pytest.mark.skipif(NOT_LOADED is not None, reason=f"{NOT_LOADED}")


def _op_packed(blocks: np.ndarray | torch.Tensor, qtype: int, cols: int) -> np.ndarray:
    data = torch.from_numpy(blocks) if isinstance(blocks, np.ndarray) else blocks
    out = torch.full((packed_bytes(qtype, data.shape[0], cols),), 0xAA, dtype=torch.uint8)  # padding must be written
    torch.ops.folovllm.gguf_pack(out, data, qtype, cols)
    return out.numpy()


@settings(max_examples=60, deadline=None)
@given(qtype=st.sampled_from(PACKED_TYPES), col_blocks=st.integers(1, 21), supers=st.integers(1, 9),
       threads=st.sampled_from([1, 2, 3, 5]), seed=st.integers(0, 2**16))
def test_op_is_pack_gguf(qtype: gguf.GGMLQuantizationType, col_blocks: int, supers: int, threads: int,
                         seed: int) -> None:
    """Any count of column blocks (odd ones, fewer than the threads, not a multiple of them), any K."""
    rows, cols = 16 * col_blocks, LAYOUTS[int(qtype)].super_k * supers
    blocks = random_blocks(qtype, rows, cols, seed=seed)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = _op_packed(blocks, int(qtype), cols)
    finally:
        torch.set_num_threads(previous)
    np.testing.assert_array_equal(got, pack_gguf(blocks, int(qtype), rows, cols))


def test_real_blocks_and_strided_rows() -> None:
    """SmolLM2's own Q4_1 and Q8_0 tensors (a real file's scales and codes); a row-strided view of them (the
    loader's q/k rows come permuted) packs as its copy does."""
    reader = gguf.GGUFReader(default_model_path())
    seen = set()
    for tensor in reader.tensors:
        qtype, cols = int(tensor.tensor_type), int(tensor.shape[0])
        if qtype in seen or len(tensor.shape) != 2 or not packable(qtype, int(tensor.shape[1]), cols):
            continue
        blocks = np.array(tensor.data.reshape(int(tensor.shape[1]), -1)[:512])
        seen.add(qtype)
        np.testing.assert_array_equal(_op_packed(blocks, qtype, cols), pack_gguf(blocks, qtype, len(blocks), cols))
        strided = torch.from_numpy(blocks)[::2]
        np.testing.assert_array_equal(_op_packed(strided, qtype, cols),
                                      pack_gguf(blocks[::2].copy(), qtype, len(blocks) // 2, cols))
    assert seen == {int(Q.Q4_1), int(Q.Q8_0)}


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda t: t.name)
def test_switch_off_loads_the_same_weight(qtype: gguf.GGMLQuantizationType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUFWeight of two pieces loaded with FOLOVLLM_GGUF_FAST_LOAD on (our op) and off (numpy): the same bytes."""
    cols = 2 * LAYOUTS[int(qtype)].super_k
    pieces = [random_blocks(qtype, 48, cols, seed=1), random_blocks(qtype, 16, cols, seed=2)]
    numpy_calls = []
    monkeypatch.setattr(gguf_native, "pack_gguf", lambda *args, **kw: numpy_calls.append(1) or pack_gguf(*args, **kw))
    loaded = {}
    for value, calls in (("on", 0), ("off", 2)):
        numpy_calls.clear()
        with envs.overridden({"FOLOVLLM_GGUF_FAST_LOAD": value}):
            weight = GGUFWeight([(int(qtype), len(p)) for p in pieces], cols)
            for i, data in enumerate(pieces):
                piece = getattr(weight, f"piece{i}")
                piece.weight_loader(piece, torch.from_numpy(data))
        loaded[value] = weight.weight
        assert len(numpy_calls) == calls, value
    assert torch.equal(loaded["on"], loaded["off"])
    expected = np.concatenate([pack_gguf(p, int(qtype), len(p), cols) for p in pieces])
    np.testing.assert_array_equal(loaded["on"].numpy(), expected)


def test_errors() -> None:
    blocks = torch.from_numpy(random_blocks(Q.Q4_K, 16, 256))
    out = torch.empty(packed_bytes(int(Q.Q4_K), 16, 256), dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="is not held packed"):
        torch.ops.folovllm.gguf_pack(out, blocks, int(Q.Q2_K), 256)
    with pytest.raises(RuntimeError, match="take 288 bytes a row, not 144"):
        torch.ops.folovllm.gguf_pack(out, blocks, int(Q.Q4_K), 512)
    with pytest.raises(RuntimeError, match="cannot be held packed"):
        torch.ops.folovllm.gguf_pack(out, blocks[:8], int(Q.Q4_K), 256)
    with pytest.raises(RuntimeError, match="out must be contiguous uint8"):
        torch.ops.folovllm.gguf_pack(out[:-1], blocks, int(Q.Q4_K), 256)
    with pytest.raises(RuntimeError, match="blocks must be uint8"):
        torch.ops.folovllm.gguf_pack(out, blocks.float(), int(Q.Q4_K), 256)
