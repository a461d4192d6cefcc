"""GGUF types held packed (gguf_native.py, csrc/cpu/gguf_gemm.cpp): the packed rows are the gguf package's
dequantized values bit for bit, and gguf_gemm matches x W^T on those values for every type, mixes of types,
rows and activation dtypes, at every tier this host has."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from folovllm.model.quantization.gguf_native import GGUFWeight, pack_gguf, packable, packed_bytes
from tests.model.quant.gguf_files import PACKED_TYPES, Q, random_blocks
from tests.tiers import kernel_missing

NOT_BUILT = kernel_missing("gguf")
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")


def _dequantized(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> torch.Tensor:
    return torch.from_numpy(np.array(gguf.quants.dequantize(data, qtype)))


def _loaded(pieces: list[tuple[gguf.GGMLQuantizationType, np.ndarray]], cols: int) -> GGUFWeight:
    weight = GGUFWeight([(int(q), data.shape[0]) for q, data in pieces], cols)
    for i, (_, data) in enumerate(pieces):
        piece = getattr(weight, f"piece{i}")
        piece.weight_loader(piece, torch.from_numpy(data))
    return weight


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda t: t.name)
def test_packed_rows_are_the_files_values(qtype: gguf.GGMLQuantizationType) -> None:
    rows, cols = 48, 512
    data = random_blocks(qtype, rows, cols, seed=int(qtype))
    weight = _loaded([(qtype, data)], cols)
    assert weight.weight.numel() == packed_bytes(int(qtype), rows, cols)
    assert not list(weight.parameters())  # the piece views went once loaded
    got = weight.rows_of(torch.arange(rows), torch.float32)
    assert torch.equal(got, _dequantized(data, qtype))
    ids = torch.tensor([[5, 0], [47, 16]])
    assert torch.equal(weight.rows_of(ids, torch.bfloat16), _dequantized(data, qtype)[ids].bfloat16())


def test_packed_size_is_the_files() -> None:
    """The file's bytes, but for Q4_K's and Q5_K's six-bit scales and mins, held a byte each (64 more bytes per
    16 rows of a 256-weight block: 2.8 % of Q4_K)."""
    for qtype in PACKED_TYPES:
        file_bytes = random_blocks(qtype, 16, 1024).size
        extra = 4 * 64 if qtype in (Q.Q4_K, Q.Q5_K) else 0
        assert packed_bytes(int(qtype), 16, 1024) == file_bytes + extra, qtype.name


def _check(pieces: list[tuple[gguf.GGMLQuantizationType, np.ndarray]], cols: int, m: int, dtype: torch.dtype,
           seed: int) -> None:
    weight = _loaded(pieces, cols)
    reference = torch.cat([_dequantized(data, q) for q, data in pieces]).double()
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(seed)).to(dtype)
    got = weight.matmul(x)
    assert got.dtype == dtype and got.shape == (m, reference.shape[0])
    expected = x.double() @ reference.t()
    # fp32: exact products, fp32 sums; bf16: the output's own rounding (2^-8 relative) dominates
    rel = 2e-5 if dtype == torch.float32 else 8e-3
    err = (got.double() - expected).abs().max().item()
    assert err <= rel * expected.abs().max().item(), err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 13, 33])
@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda t: t.name)
def test_matmul_matches_the_dequantized_weight(kernel_tier: str, qtype: gguf.GGMLQuantizationType, m: int,
                                               dtype: torch.dtype) -> None:
    # 48 rows: a pair of column blocks and one alone
    _check([(qtype, random_blocks(qtype, 48, 512, seed=m))], 512, m, dtype, seed=m + int(qtype))


@pytest.mark.parametrize("m", [1, 4, 16])
def test_a_layer_mixes_types(kernel_tier: str, m: int) -> None:
    """A merged layer's parts in their own types (a Q4_K_M file's q, k in Q4_K and v in Q6_K), one call."""
    pieces = [(Q.Q4_K, random_blocks(Q.Q4_K, 32, 768, 1)), (Q.Q6_K, random_blocks(Q.Q6_K, 16, 768, 2)),
              (Q.Q8_0, random_blocks(Q.Q8_0, 48, 768, 3)), (Q.Q5_K, random_blocks(Q.Q5_K, 16, 768, 4)),
              (Q.Q4_0, random_blocks(Q.Q4_0, 16, 768, 5)), (Q.Q4_1, random_blocks(Q.Q4_1, 32, 768, 6))]
    _check(pieces, 768, m, torch.bfloat16, seed=m)
    _check(pieces, 768, m, torch.float32, seed=m)


def test_tiers_agree_with_each_other(kernel_tier: str) -> None:
    """Every tier's form computes the same products: fp32 activations agree to fp32 rounding across tiers."""
    from folovllm.platforms import kernel_library

    data = random_blocks(Q.Q6_K, 32, 256, seed=7)
    weight = _loaded([(Q.Q6_K, data)], 256)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    got = weight.matmul(x)
    with kernel_library.running_at("avx2"):
        base = weight.matmul(x)
    torch.testing.assert_close(got, base, rtol=1e-5, atol=1e-5 * float(base.abs().max()))


@pytest.mark.parametrize("m", [1, 5, 17])
def test_argmax_is_the_logits_argmax(kernel_tier: str, m: int) -> None:
    """gguf_argmax: each row's first largest logit of gguf_gemm's (bf16 rows: kept inside the matmul's loop)."""
    weight = _loaded([(Q.Q8_0, random_blocks(Q.Q8_0, 48, 256, 1)), (Q.Q6_K, random_blocks(Q.Q6_K, 32, 256, 2))], 256)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).to(dtype)
        ids = torch.ops.folovllm.gguf_argmax(x, weight.weight, weight.parts)
        assert torch.equal(ids, weight.matmul(x).float().argmax(-1))
    tie = torch.zeros(2, 256, dtype=torch.bfloat16)  # every logit 0: the first column wins
    assert torch.ops.folovllm.gguf_argmax(tie, weight.weight, weight.parts).tolist() == [0, 0]


@pytest.mark.parametrize("m", [1, 17, 130])
def test_claimed_tasks_give_the_bits_of_fixed_shares(kernel_tier: str, m: int) -> None:
    """linear_claims on: the threads claim runs of the layer's tasks as they go; off: a fixed share each."""
    from folovllm.platforms import kernel_library

    weight = _loaded([(Q.Q4_K, random_blocks(Q.Q4_K, 512, 256, 1)), (Q.Q6_K, random_blocks(Q.Q6_K, 256, 256, 2))],
                     256)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m))
    outputs = {}
    for on in (False, True):
        with kernel_library.kernel_switches(linear_claims=on):
            outputs[on] = [weight.matmul(x), weight.matmul(x.bfloat16()),
                           torch.ops.folovllm.gguf_argmax(x.bfloat16(), weight.weight, weight.parts)]
    for fixed, claimed in zip(outputs[False], outputs[True]):
        assert torch.equal(fixed, claimed)


def test_leading_dims_and_empty_input() -> None:
    weight = _loaded([(Q.Q8_0, random_blocks(Q.Q8_0, 32, 64))], 64)
    x = torch.randn(2, 3, 64).bfloat16()
    torch.testing.assert_close(weight.matmul(x), weight.matmul(x.view(6, 64)).view(2, 3, 32), rtol=0, atol=0)
    assert weight.matmul(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 32)


def test_packable_and_errors() -> None:
    assert packable(int(Q.Q6_K), 32, 512) and not packable(int(Q.Q6_K), 24, 512)  # outputs: blocks of 16
    assert not packable(int(Q.Q2_K), 32, 512) and not packable(int(Q.F16), 32, 512)
    with pytest.raises(ValueError, match="cannot be held packed"):
        pack_gguf(random_blocks(Q.Q8_0, 8, 64), int(Q.Q8_0), 8, 64)
    weight = GGUFWeight([(int(Q.Q4_K), 16)], 256)
    with pytest.raises(ValueError, match="takes the file's blocks"):
        weight.piece0.weight_loader(weight.piece0, torch.zeros(16, 100, dtype=torch.uint8))
    loaded = _loaded([(Q.Q4_K, random_blocks(Q.Q4_K, 16, 256))], 256)
    with pytest.raises(RuntimeError, match="does not match the weight's inputs"):
        loaded.matmul(torch.randn(1, 128))
    with pytest.raises(RuntimeError, match="out of range"):
        loaded.rows_of(torch.tensor([16]), torch.float32)
    bad_parts = loaded.parts.clone()
    bad_parts[0, 1] = 32  # more rows than the bytes hold
    with pytest.raises(RuntimeError, match="runs past the weight"):
        torch.ops.folovllm.gguf_gemm(torch.randn(1, 256), loaded.weight, bad_parts)
    bad_parts[0, 0] = int(Q.Q2_K)
    with pytest.raises(RuntimeError, match="is not held packed"):
        torch.ops.folovllm.gguf_gemm(torch.randn(1, 256), loaded.weight, bad_parts)
