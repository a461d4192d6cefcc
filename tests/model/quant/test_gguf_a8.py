"""GGUF Q4_K and Q6_K linears with int8 activations (``gguf_gemm_a8``: csrc/cpu/quant_gguf_a8.h,
AVX512_VNNI): the product against its own rounding of the activations on the gguf package's dequantized
weights at every row count, close to the bf16-activation product, gguf_gemm's bits wherever it does not
round (other types, fewer rows than asked, fp32 rows), the head's ``gguf_argmax`` the argmax of its logits,
and the ``FOLOVLLM_CPU_GGUF_A8`` switch (auto by default: from ``GGUF_A8_MIN_ROWS`` rows): greedy tokens of a
tiny packed model agree with it off by the top-2 rule, the layer chain's team gives the op's bits, off is
gguf_gemm's path bit for bit."""
from __future__ import annotations


import pytest
import torch

from folovllm.model.quantization.gguf_native import GGUFPackedLinearMethod
from folovllm.platforms import platform_for
from folovllm.platforms.cpu import GGUF_A8_MIN_ROWS
from tests.helpers import switches
from tests.model.quant.gguf_files import Q, random_blocks, write_tiny_llama_gguf
from tests.model.quant.test_gguf_native import _dequantized, _loaded
from tests.model.quant.test_gguf_packed_model import _greedy, _load, assert_team_gives_the_ops_bits
from tests.model.test_layer_chain import chain_model
from tests.tiers import kernel_missing
from tests.tolerance import BF16_TOP2_TOLERANCE, assert_greedy_match, top2_gaps

NOT_BUILT = kernel_missing("gguf")
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")


def vnni_here() -> bool:
    """Whether gguf_gemm_a8 rounds at the library's current tier (avx512_bf16 and up, on a CPU with VNNI)."""
    return torch.ops.folovllm.tier() in ("avx512_bf16", "amx") and torch.cpu._is_vnni_supported()


@pytest.fixture
def vnni() -> None:
    if not vnni_here():
        pytest.skip("no AVX512_VNNI at this tier: gguf_gemm_a8 is gguf_gemm here")


needs_vnni = pytest.mark.usefixtures("vnni")
A8_TYPES = (Q.Q4_K, Q.Q6_K)


def _a8_reference(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in fp64: per row and 256 inputs d = max |x| / 127 and a = round(x / d) (half to
    even, as the kernel: x times fp32 1 / d), then (d a) W^T."""
    m, k = x.shape
    blocks = x.float().view(m, k // 256, 256)
    d = blocks.abs().amax(-1) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    a = (blocks * inv[..., None]).round().double()
    return (a * d.double()[..., None]).view(m, k) @ weights.double().t()


@needs_vnni
@pytest.mark.parametrize("qtype", A8_TYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 16])
def test_matches_its_rounding(qtype: int, m: int) -> None:
    data = random_blocks(qtype, 48, 1024, seed=m)  # a pair of column blocks and one alone, 4 super-blocks
    weight = _loaded([(qtype, data)], 1024)
    x = torch.randn(m, 1024, generator=torch.Generator().manual_seed(m)).bfloat16()
    got = weight.matmul(x, a8_rows=1)
    assert got.dtype == torch.bfloat16 and got.shape == (m, 48)
    expected = _a8_reference(x, _dequantized(data, qtype))
    err = (got.double() - expected).abs().max().item()
    assert err <= 8e-3 * expected.abs().max().item(), err  # the bf16 output's own rounding dominates
    assert not torch.equal(got, weight.matmul(x))  # it did round: not the bf16 path's bits


@needs_vnni
@pytest.mark.parametrize("qtype", A8_TYPES)
@pytest.mark.parametrize("m", [4, 16])
def test_close_to_bf16_activations(qtype: int, m: int) -> None:
    """The extra rounding is small: int8 activations land within ~1 % of the bf16-activation product."""
    data = random_blocks(qtype, 64, 2048, seed=3)
    weight = _loaded([(qtype, data)], 2048)
    x = torch.randn(m, 2048, generator=torch.Generator().manual_seed(0)).bfloat16()
    exact = x.double() @ _dequantized(data, qtype).double().t()
    assert (weight.matmul(x, a8_rows=1).double() - exact).norm() <= 0.02 * exact.norm()


@pytest.mark.parametrize("m", [1, 3, 4, 16])
def test_gguf_gemms_bits_where_it_does_not_round(m: int) -> None:
    """A Q4_K_M layer's mix: its Q8_0 part is gguf_gemm's bits at any rows; the whole output is below
    a8_rows rows (4 here), for fp32 rows, and on CPUs without VNNI; its Q4_K and Q6_K parts round from there."""
    pieces = [(Q.Q6_K, random_blocks(Q.Q6_K, 16, 512, 1)), (Q.Q4_K, random_blocks(Q.Q4_K, 32, 512, 2)),
              (Q.Q8_0, random_blocks(Q.Q8_0, 16, 512, 3))]
    weight = _loaded(pieces, 512)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m)).bfloat16()
    got, base = weight.matmul(x, a8_rows=4), weight.matmul(x)
    assert torch.equal(got[:, 48:], base[:, 48:])
    rounds = m >= 4 and vnni_here()
    assert torch.equal(got[:, :16], base[:, :16]) != rounds and torch.equal(got[:, 16:48], base[:, 16:48]) != rounds
    assert torch.equal(weight.matmul(x.float(), a8_rows=1), weight.matmul(x.float()))
    with pytest.raises(RuntimeError, match="a8_rows"):
        weight.matmul(x, a8_rows=-1)


@pytest.mark.parametrize("m", [1, 5, 17])
def test_argmax_is_the_a8_logits_argmax(m: int) -> None:
    """A packed head's greedy token with int8 activations: the first largest of gguf_gemm_a8's logits."""
    weight = _loaded([(Q.Q6_K, random_blocks(Q.Q6_K, 48, 512, 1)), (Q.Q4_K, random_blocks(Q.Q4_K, 32, 512, 2))],
                     512)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m)).bfloat16()
    for a8_rows in (0, 1, 5):
        ids = torch.ops.folovllm.gguf_argmax(x, weight.weight, weight.parts, a8_rows)
        assert torch.equal(ids, weight.matmul(x, a8_rows).float().argmax(-1))


@needs_vnni
def test_zero_rows_and_leading_dims() -> None:
    weight = _loaded([(Q.Q4_K, random_blocks(Q.Q4_K, 32, 512))], 512)
    x = torch.randn(2, 3, 512).bfloat16()
    x[0, 1, :256] = 0  # a zero scale: its products are zero, not NaN
    x[1, 0] = 0
    y = weight.matmul(x, a8_rows=1)
    assert torch.equal(y, weight.matmul(x.view(6, 512), a8_rows=1).view(2, 3, 32))
    assert torch.equal(y[1, 0], torch.zeros(32, dtype=torch.bfloat16)) and not y.isnan().any()
    assert weight.matmul(torch.empty(0, 512, dtype=torch.bfloat16), a8_rows=1).shape == (0, 32)


# every linear Q4_K but v and down (Q6_K), as a Q4_K_M file has them; hidden 512: two super-blocks
LAYERS = [{"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}, {"attn_v": Q.Q6_K}]


@pytest.fixture(scope="module")
def q4_k_m_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("gguf") / "q4_k_m.gguf"
    write_tiny_llama_gguf(path, LAYERS, embedding=Q.Q4_K, output=Q.Q6_K, default=Q.Q4_K, hidden=512, inter=1024,
                          vocab=512)
    return str(path)


@pytest.mark.parametrize("value, rows", [(None, GGUF_A8_MIN_ROWS), ("auto", GGUF_A8_MIN_ROWS), ("on", 1), ("off", 0)])
def test_switch_values(value: str | None, rows: int) -> None:
    """auto (the default) rounds from GGUF_A8_MIN_ROWS rows a call, on from one, off never."""
    with switches(**({"CPU_GGUF_A8": value} if value else {})):
        assert platform_for("cpu").linear_kernels(torch.bfloat16).gguf_a8_rows == rows


def _packed_methods(model: torch.nn.Module) -> list[GGUFPackedLinearMethod]:
    return [m.method for m in model.modules() if isinstance(getattr(m, "method", None), GGUFPackedLinearMethod)]


def test_switch(q4_k_m_gguf: str) -> None:
    with switches(CPU_GGUF_A8="off"):
        off = _load(q4_k_m_gguf, quantize_lm_head="auto")
    with switches(CPU_GGUF_A8="on"):
        on = _load(q4_k_m_gguf, quantize_lm_head="auto")
    auto = _load(q4_k_m_gguf, quantize_lm_head="auto")
    # every packed linear, the head among them, takes the switch
    assert [m.a8_rows for m in _packed_methods(off)] == [0] * len(_packed_methods(off))
    assert {m.a8_rows for m in _packed_methods(on)} == {1} and {m.a8_rows for m in _packed_methods(auto)} == {
        GGUF_A8_MIN_ROWS}
    assert isinstance(on.lm_head.method, GGUFPackedLinearMethod)
    for m in (1, 2, 5):
        x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m)).bfloat16()
        qkv_off, qkv_on = off.model.layers[0].self_attn.qkv_proj, on.model.layers[0].self_attn.qkv_proj
        assert torch.equal(qkv_off(x), qkv_off.gguf.matmul(x))  # off: gguf_gemm's path, bit for bit
        assert torch.equal(off.lm_head.method.argmax(off.lm_head)(x), off.lm_head(x).float().argmax(-1))
        assert torch.equal(qkv_on(x), qkv_on.gguf.matmul(x, a8_rows=1))
        qkv_auto = auto.model.layers[0].self_attn.qkv_proj
        assert torch.equal(qkv_auto(x), qkv_auto.gguf.matmul(x, a8_rows=GGUF_A8_MIN_ROWS))


@pytest.mark.parametrize("value", ["on", "auto"])
def test_greedy_tokens_agree_with_the_switch_off(q4_k_m_gguf: str, value: str) -> None:
    """2 to 6 rows a call (a 2-token prompt, 5 steps: every step's linears and head take int8 activations): the
    same greedy tokens as bf16 activations, but where those's top two were within the bf16 tolerance."""
    prompt = [5, 17]
    with switches(CPU_GGUF_A8="off"):
        reference, gaps_from = _greedy(_load(q4_k_m_gguf, quantize_lm_head="auto"), prompt, 5, torch.bfloat16)
    with switches(CPU_GGUF_A8=value):
        a8_model = _load(q4_k_m_gguf, quantize_lm_head="auto")
    tokens, logits = _greedy(a8_model, prompt, 5, torch.bfloat16)
    assert_greedy_match(tokens, reference, top2_gaps(gaps_from), BF16_TOP2_TOLERANCE)
    if vnni_here():
        assert not torch.equal(logits[0], gaps_from[0])  # the switch took the int8 path


NO_TEAM = kernel_missing("team")


@pytest.mark.skipif(NO_TEAM is not None, reason=f"{NO_TEAM}")
@pytest.mark.parametrize("threads", [1, 2])
def test_team_gives_the_ops_bits(q4_k_m_gguf: str, threads: int) -> None:
    """The switch on: a decode step on the layer chain's team (gguf_gemm_a8's loops, split by columns) gives
    the op calls', the direct calls' and the modules' bits."""
    assert_team_gives_the_ops_bits(chain_model(q4_k_m_gguf, torch.bfloat16, {"CPU_GGUF_A8": "on"},
                                               load_quantized=True, quantize_lm_head="auto"), threads)
