"""The int8 LM head's greedy shortcut (``int8_argmax``): each row's argmax of the int8 head's own logits, ties
to the first token, and ``CausalLM.greedy_head`` offering it for a model with an int8 head."""
from __future__ import annotations

import pytest
import torch

from folovllm.model.loader import load_model
from folovllm.model.quantization.cpu_int4 import pack_int8
from folovllm.platforms import platform_for
from tests.helpers import switches
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401 (a fixture)
from tests.tiers import kernel_missing

NOT_BUILT = kernel_missing("int4")
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [0, 1, 5, 64])
def test_equals_the_argmax_of_the_logits(rows: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(rows)
    codes = pack_int8(torch.randint(-127, 128, (4096, 64), dtype=torch.int8, generator=gen))
    scales = (torch.rand(4096, generator=gen) * 0.01 + 1e-3).to(dtype)
    x = torch.randn(rows, 64, generator=gen).to(dtype)
    ids = torch.ops.folovllm.int8_argmax(x, codes, scales)
    assert ids.dtype == torch.int64 and ids.shape == (rows,)
    assert torch.equal(ids, torch.ops.folovllm.int8_gemm(x, codes, scales).float().argmax(-1))


@pytest.mark.parametrize("fused", [True, False])
def test_ties_go_to_the_first_token(fused: bool) -> None:
    codes = torch.randint(-20, 21, (1024, 32), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    codes[[70, 300, 900]] = 100  # three equal rows, each logit 3200 where every other is at most 640
    x = torch.ones(1, 32).bfloat16()
    ids = torch.ops.folovllm.int8_argmax(x, pack_int8(codes), torch.ones(1024).bfloat16(), fused)
    assert ids.tolist() == [70]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 4, 7])
def test_fused_equals_the_logits_argmax(rows: int, threads: int) -> None:
    """The argmax kept inside the matmul's loop picks the logits path's tokens: logits that round to the same
    bf16 (small activations, repeated weight rows) tie, and the first wins; NaN logits win as in torch."""
    gen = torch.Generator().manual_seed(rows)
    codes = torch.randint(-127, 128, (4112, 64), dtype=torch.int8, generator=gen)
    codes[5::9] = codes[3]  # many equal logits
    x = (torch.randn(rows, 64, generator=gen) * 0.01).bfloat16()
    scales = torch.rand(4112, generator=gen) * 0.01 + 1e-3
    nan_scales = torch.where(torch.arange(4112) % 1500 == 1499, float("nan"), scales)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for s in (scales, nan_scales, torch.full((4112,), float("-inf"))):
            packed = pack_int8(codes)
            fused = torch.ops.folovllm.int8_argmax(x, packed, s)
            assert torch.equal(fused, torch.ops.folovllm.int8_argmax(x, packed, s, False))
            assert torch.equal(fused, torch.ops.folovllm.int8_gemm(x, packed, s).float().argmax(-1))
    finally:
        torch.set_num_threads(old)


def test_greedy_head_of_an_int8_head(tiny_llama, tmp_path) -> None:  # noqa: F811
    gptq, _ = make_gptq_model(tiny_llama, tmp_path)
    model = load_model(gptq, dtype=torch.bfloat16, device="cpu", quantize_lm_head="on", platform=platform_for("cpu"))
    head = model.greedy_head()
    assert head is not None
    hidden = torch.randn(7, model.arch.hidden_size).bfloat16()
    assert torch.equal(head(hidden), model.compute_logits(hidden).argmax(-1))
    with switches(CPU_LINEAR="torch"):
        plain = load_model(gptq, dtype=torch.bfloat16, device="cpu", quantize_lm_head="off",
                           platform=platform_for("cpu"))
    assert plain.greedy_head() is None  # a plain F.linear head: no shortcut
