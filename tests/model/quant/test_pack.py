import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.model.quantization.pack import pack_int32, unpack_int32


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 4, 8]), rows=st.integers(1, 6), cols=st.integers(1, 6),
       dim=st.sampled_from([0, 1]), seed=st.integers(0, 2**16))
def test_unpack_inverts_pack(bits, rows, cols, dim, seed):
    per_int = 32 // bits
    shape = [rows, cols]
    shape[dim] *= per_int
    codes = torch.randint(0, 2**bits, shape, generator=torch.Generator().manual_seed(seed))
    packed = pack_int32(codes, bits, dim)
    assert packed.dtype == torch.int32
    assert packed.shape[dim] == shape[dim] // per_int and packed.shape[1 - dim] == shape[1 - dim]
    assert torch.equal(unpack_int32(packed, bits, dim), codes.to(torch.int32))


def test_first_code_sits_in_the_lowest_bits():
    codes = torch.tensor([[1], [2], [3], [4], [5], [6], [7], [15]])
    packed = pack_int32(codes, 4, dim=0)
    assert packed.shape == (1, 1)
    assert int(packed) & 0xFFFFFFFF == 0xF7654321


def test_bad_codes_are_refused():
    with pytest.raises(ValueError, match="4-bit codes must lie in"):
        pack_int32(torch.tensor([[16]] * 8), 4, dim=0)
    with pytest.raises(ValueError, match="not a multiple of 8"):
        pack_int32(torch.zeros(6, 1, dtype=torch.int64), 4, dim=0)
    with pytest.raises(ValueError, match="supported bits"):
        pack_int32(torch.zeros(8, 1, dtype=torch.int64), 3, dim=0)
