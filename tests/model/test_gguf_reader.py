"""open_gguf under FOLOVLLM_GGUF_FAST_LOAD: its reader (plain array views of the mapping) reads every field and
tensor of a file as gguf's own reader does (the switch off), on the shipped SmolLM2 file and a Q4_K_M-mix file."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from folovllm import envs
from folovllm.model.loader import default_model_path
from folovllm.model.loader.gguf import open_gguf
from tests.model.quant.gguf_files import Q, write_tiny_llama_gguf


def _same_reads(fast: gguf.GGUFReader, plain: gguf.GGUFReader) -> None:
    assert list(fast.fields) == list(plain.fields)
    for name, field in plain.fields.items():
        other = fast.fields[name]
        assert (other.offset, other.types, other.data) == (field.offset, field.types, field.data), name
        assert len(other.parts) == len(field.parts), name
        for a, b in zip(other.parts, field.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
        assert other.contents() == field.contents(), name
    assert fast.data_offset == plain.data_offset and fast.alignment == plain.alignment
    assert len(fast.tensors) == len(plain.tensors)
    for a, b in zip(fast.tensors, plain.tensors):
        assert (a.name, a.tensor_type, a.data_offset, a.n_bytes, a.n_elements) == (
            b.name, b.tensor_type, b.data_offset, b.n_bytes, b.n_elements)
        assert np.array_equal(a.shape, b.shape) and a.data.dtype == b.data.dtype
        assert a.data.shape == b.data.shape and np.array_equal(a.data, b.data), a.name
        assert not a.data.flags.writeable  # the mapping stays read-only


@pytest.mark.parametrize("which", ["smollm2", "tiny-q4_k_m"])
def test_fast_reader_reads_what_gguf_reads(which: str, tmp_path: Path) -> None:
    path = default_model_path()
    if which != "smollm2":
        path = str(tmp_path / "tiny.gguf")
        write_tiny_llama_gguf(Path(path), [{"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}] * 2, embedding=Q.Q4_K,
                              output=Q.Q6_K, default=Q.Q4_K)
    with envs.overridden({"FOLOVLLM_GGUF_FAST_LOAD": "off"}):
        plain = open_gguf(path)
    assert type(plain) is gguf.GGUFReader
    fast = open_gguf(path)
    assert type(fast) is not gguf.GGUFReader
    _same_reads(fast, plain)
