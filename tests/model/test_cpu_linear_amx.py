"""The bf16 linear kernel's AMX form (csrc/cpu/linear_amx.h), on hosts with AMX: against F.linear and the
row-at-a-time form, each row alone within the form, any thread count the same bits, the greedy head equal to
its logits' argmax, and greedy tokens with the form and with the tier capped below it
(``FOLOVLLM_CPU_ISA=avx512_bf16``). Elsewhere every test here is skipped, naming the tier."""
from __future__ import annotations

import pytest
import torch

from folovllm import LLM, SamplingParams
from folovllm.model.quantization.packed import pack_linear_weight, packed_linear
from folovllm.platforms import kernel_library
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401
from tests.helpers import switches
from tests.model.test_cpu_bf16_linear import assert_matches_f_linear, same_bits_on_any_thread_count
from tests.tiers import kernel_missing
from tests.tolerance import BF16_TOP2_TOLERANCE, assert_greedy_match

torch.set_num_threads(2)
MISSING = kernel_missing("linear") or (None if torch.ops.folovllm.has_kernel("linear_amx") else
                                       f"no AMX form at tier {kernel_library.tier()} (an AMX host runs it)")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}")
MIN_ROWS = 16  # the fewest rows a call takes the form with


def row_at_a_time(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    with kernel_library.running_at("avx512_bf16"):
        return packed_linear(x, packed, bias)


@pytest.mark.parametrize("rows", [16, 17, 31, 33, 48, 64, 129, 300])
@pytest.mark.parametrize("out_features, in_features", [(192, 96), (576, 160), (128, 1536)])
def test_form_matches_f_linear_and_the_row_at_a_time_form(rows: int, out_features: int, in_features: int) -> None:
    torch.manual_seed(rows)
    weight = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    bias = torch.randn(out_features, dtype=torch.bfloat16)
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    tiles = packed_linear(x, packed, bias)
    assert_matches_f_linear(tiles, x, weight, bias)
    # the same sums along K, a K pair's products rounded apart: a bf16 step now and then
    other = row_at_a_time(x, packed, bias)
    assert (tiles != other).sum() <= max(1, tiles.numel() // 100)
    assert ((tiles.float() - other.float()).abs() <= 2**-7 * other.float().abs() + 1e-6).all()


def test_each_row_alone_within_the_form_and_fewer_rows_take_the_other() -> None:
    torch.manual_seed(2)
    weight = torch.randn(192, 160, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    x = torch.randn(263, 160, dtype=torch.bfloat16)  # two 128-row chunks and a tail; 32-row units and a tail
    together = packed_linear(x, packed, None)
    for rows in (slice(0, 16), slice(5, 40), slice(100, 163), slice(240, 263), slice(7, 139), slice(50, 98)):
        assert torch.equal(together[rows], packed_linear(x[rows], packed, None))
    for rows in (slice(0, 1), slice(3, 18)):  # below the form's rows, or all of them: the row-at-a-time bits
        part = x[rows]
        expected = row_at_a_time(part, packed) if part.shape[0] < MIN_ROWS else together[rows]
        assert torch.equal(packed_linear(part, packed, None), expected)
    # a K the tile unit does not step through (a multiple of 2, not of 32): the row-at-a-time form
    odd = pack_linear_weight(torch.randn(64, 48, dtype=torch.bfloat16), ours=True)
    x = torch.randn(40, 48, dtype=torch.bfloat16)
    assert torch.equal(packed_linear(x, odd, None), row_at_a_time(x, odd))


@pytest.mark.parametrize("rows", [16, 20, 64, 129, 300])
def test_any_thread_count_gives_the_same_bits(rows: int) -> None:
    # 9 weight blocks: 32-row units of a block may land on either thread
    same_bits_on_any_thread_count(rows)


@pytest.mark.parametrize("rows", [15, 16, 40])
def test_greedy_head_is_the_argmax_of_the_forms_logits(rows: int) -> None:
    torch.manual_seed(rows)
    packed = pack_linear_weight(torch.randn(4096, 64, dtype=torch.bfloat16), ours=True)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    assert torch.equal(torch.ops.folovllm.linear_argmax(x, packed), packed_linear(x, packed, None).argmax(dim=-1))


def test_capping_the_tier_keeps_greedy_tokens(tiny_llama_dir) -> None:  # noqa: F811
    # prompts of a few dozen tokens, 20 sequences decoding together: prefill and decode calls of 16 rows or more
    prompts = [{"prompt_token_ids": p} for p in random_prompts(20, seed=4)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for isa in ("amx", "avx512_bf16"):
        with switches(CPU_ISA=isa):
            llm = make_llm(tiny_llama_dir, dtype="bfloat16", max_num_batched_tokens=256)
        assert bool(torch.ops.folovllm.has_kernel("linear_amx")) == (isa == "amx")
        tokens[isa] = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens["amx"] == tokens["avx512_bf16"]


@pytest.mark.slow
def test_default_model_greedy_tokens_with_the_form_and_without() -> None:
    """tests/tolerance.py's top-2 rule tells a flip at a near-tie (a logit moved by a rounding step) from a bug."""
    prompts = ["The capital of France is", "def fibonacci(n):", "List three colors:\n1.",
               "Summarize: " + " ".join(f"Item {i} is a {c} box." for i, c in enumerate(["red", "blue"] * 10))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    runs = {}
    for isa in ("amx", "avx512_bf16"):
        with switches(CPU_ISA=isa):
            llm = LLM(dtype="bfloat16", device="cpu", max_model_len=256, kv_cache_memory="64MiB",
                      max_num_batched_tokens=64, load_quantized="off")
        runs[isa] = []
        for out in llm.generate(prompts * 5, params, use_tqdm=False):  # 20 sequences: decode calls of 20 rows
            top2 = [sorted((lp.logprob for lp in step.values()), reverse=True) for step in out.outputs[0].logprobs]
            runs[isa].append((out.outputs[0].token_ids, [a - b for a, b in top2]))
        del llm
    for (tokens, _), (ref_tokens, ref_gaps) in zip(runs["amx"], runs["avx512_bf16"]):
        assert_greedy_match(tokens, ref_tokens, ref_gaps, BF16_TOP2_TOLERANCE)
