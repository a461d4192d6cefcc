"""Our bf16 linear kernel (csrc/cpu/linear.cpp) against F.linear and an fp64 reference at every tier it
has, and through the packing method, the loader and the engine (``FOLOVLLM_CPU_LINEAR=folovllm`` against
``torch``: greedy tokens)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from folovllm import LLM, SamplingParams
from folovllm.model.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    WeightConfig,
)
from folovllm.model.loader import load_model
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod
from folovllm.model.quantization.packed import (
    PackedLinearMethod,
    PackedRows,
    pack_linear_weight,
    packed_linear,
    select_linear_methods,
)
from folovllm.platforms import LinearKernels, kernel_library, platform_for
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401
from tests.helpers import switches
from tests.tiers import kernel_missing, skip_unless_kernel
from tests.tolerance import BF16_TOP2_TOLERANCE, assert_greedy_match

torch.set_num_threads(2)
CPU = torch.device("cpu")
NOT_AVAILABLE = kernel_missing("linear")  # at the engine's tier, for the model and engine tests
needs_kernel = pytest.mark.skipif(NOT_AVAILABLE is not None, reason=f"{NOT_AVAILABLE}")


@pytest.fixture
def linear_tier(kernel_tier: str) -> str:
    """Each kernel test at every tier this host has where the kernel has a form."""
    skip_unless_kernel("linear")
    return kernel_tier


BF16_ULP = 2**-7  # one step of bfloat16's mantissa, relative
FP32_SUMS = 2**-14  # what fp32 sums of ~1500 products in any order may drift, relative to the sum of |products|


def assert_matches_f_linear(ours: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None) -> None:
    """Equal to F.linear up to the output's bf16 rounding of fp32 sums taken in another order (a small output
    that cancels larger products may move by a step or two), and as close to fp64."""
    theirs = F.linear(x, weight, bias)
    assert ours.dtype == torch.bfloat16 and ours.shape == theirs.shape
    exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    magnitude = F.linear(x.double().abs(), weight.double().abs(), None if bias is None else bias.double().abs())
    bound = FP32_SUMS * magnitude + BF16_ULP * exact.abs() + 1e-6
    assert bool(((ours.double() - exact).abs() <= bound).all())
    assert bool(((ours.double() - theirs.double()).abs() <= 2 * bound).all())
    assert (ours != theirs).sum() <= max(1, ours.numel() // 100)  # a rounding step now and then, not a habit


@pytest.mark.parametrize("rows", [0, 1, 3, 4, 5, 7, 64, 300])
@pytest.mark.parametrize("out_features, in_features", [(64, 2), (192, 96), (128, 1536)])
def test_kernel_matches_f_linear(rows: int, out_features: int, in_features: int, linear_tier: str) -> None:
    torch.manual_seed(rows)
    weight = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    assert not packed.is_mkldnn and packed.numel() == weight.numel()
    assert_matches_f_linear(packed_linear(x, packed, None), x, weight, None)


@pytest.mark.parametrize("rows", [1, 7, 130, 300])
def test_fp32_form_reads_bf16_rows_as_their_fp32_widening(rows: int, linear_tier: str) -> None:
    # below avx512_bf16 each thread widens bf16 x a chunk of rows at a time (K = 90 leaves a tail shorter than
    # a vector): the bits of the same rows handed over in fp32, rounded to bf16 once at the end
    if linear_tier == "avx512_bf16":
        pytest.skip("bf16 x takes the vdpbf16ps form at this tier")
    torch.manual_seed(rows)
    weight = torch.randn(192, 90, dtype=torch.bfloat16)
    bias = torch.randn(192, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    x = torch.randn(rows, 90, dtype=torch.bfloat16)
    assert torch.equal(packed_linear(x, packed, bias), packed_linear(x.float(), packed, bias).bfloat16())


def test_each_row_is_computed_alone_whatever_the_batch(linear_tier: str) -> None:
    # rows are multiplied in register groups (and chunks, or a block's panels, over threads): a row's result
    # must not depend on which group it lands in, bit for bit (its fp32 sum runs along K in one order)
    torch.manual_seed(1)
    weight = torch.randn(192, 160, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    x = torch.randn(263, 160, dtype=torch.bfloat16)  # two 128-row chunks and a tail; 6-row groups and tails
    # (12 rows or more split each weight block into panels, fewer run whole blocks: slices of either side,
    # with tails of one, two and three rows after the 6-row groups, which AVX2 runs over whole blocks apart:
    # 13, 32 and 15 rows)
    together = packed_linear(x, packed, None)
    for rows in (slice(0, 1), slice(5, 9), slice(100, 111), slice(40, 52), slice(256, 263), slice(60, 73),
                 slice(7, 39), slice(80, 95)):
        assert torch.equal(together[rows], packed_linear(x[rows], packed, None))


def same_bits_on_any_thread_count(rows: int) -> tuple[torch.Tensor, ...]:
    """A call of ``rows`` rows times a random 576 x 160 weight with bias on 1, 2 and 3 threads, the same bits
    each time: (the one-thread result, x, the weight, the bias)."""
    torch.manual_seed(rows)
    weight = torch.randn(576, 160, dtype=torch.bfloat16)
    bias = torch.randn(576, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    x = torch.randn(rows, 160, dtype=torch.bfloat16)
    try:
        torch.set_num_threads(1)
        alone = packed_linear(x, packed, bias)
        for threads in (2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(packed_linear(x, packed, bias), alone)
    finally:
        torch.set_num_threads(2)
    return alone, x, weight, bias


@pytest.mark.parametrize("rows", [1, 20, 64, 128, 129])
def test_any_thread_count_gives_the_same_bits(rows: int, linear_tier: str) -> None:
    # up to 128 rows split into (block, group of rows) items, so a thread's share may end inside a block
    # (9 blocks x 11 groups at 64 rows: 50 and 49 items on two threads); more rows split by (chunk, block)
    assert_matches_f_linear(*same_bits_on_any_thread_count(rows))


@pytest.mark.parametrize("rows", [1, 20, 32, 64, 128, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_claimed_items_give_the_bits_of_fixed_shares(rows: int, dtype: torch.dtype, linear_tier: str) -> None:
    # linear_claims on: the threads claim runs of work items as they go; off: a fixed share each. Every item
    # is computed alike on whichever thread, so every output is written once, to the same bits.
    torch.manual_seed(rows)
    weight = torch.randn(576, 160, dtype=torch.bfloat16)
    bias = torch.randn(576, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    x = torch.randn(rows, 160, dtype=dtype)
    with kernel_library.kernel_switches(linear_claims=False):
        fixed = packed_linear(x, packed, bias)
    threads = torch.get_num_threads()
    try:
        for n in (2, 3):
            torch.set_num_threads(n)
            with kernel_library.kernel_switches(linear_claims=True):
                assert torch.equal(packed_linear(x, packed, bias), fixed)
    finally:
        torch.set_num_threads(threads)
    if dtype == torch.bfloat16:
        assert_matches_f_linear(fixed, x, weight, bias)


def test_kernel_takes_bias_strided_and_batched_inputs(linear_tier: str) -> None:
    torch.manual_seed(0)
    weight = torch.randn(128, 48, dtype=torch.bfloat16)
    bias = torch.randn(128, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    strided = torch.randn(7, 96, dtype=torch.bfloat16)[:, ::2]
    assert_matches_f_linear(packed_linear(strided, packed, bias), strided, weight, bias)
    batched = torch.randn(2, 3, 48, dtype=torch.bfloat16)
    out = packed_linear(batched, packed, bias)
    assert out.shape == (2, 3, 128)
    assert_matches_f_linear(out, batched, weight, bias)


def test_weights_the_kernel_does_not_take_stay_with_the_fallback(linear_tier: str) -> None:
    onednn_bf16 = platform_for("cpu").linear_kernels(torch.bfloat16).dense_fallback == "onednn"
    for weight in (torch.randn(40, 48, dtype=torch.bfloat16), torch.randn(64, 47, dtype=torch.bfloat16),
                   torch.randn(64, 48)):
        if weight.dtype == torch.float32 or onednn_bf16:  # where oneDNN takes the dtype at this tier
            assert pack_linear_weight(weight, ours=True, onednn=True).is_mkldnn
        assert pack_linear_weight(weight, ours=True, onednn=False).dim() == 2  # plain, for F.linear
    with pytest.raises(RuntimeError, match="multiple of 64"):
        torch.ops.folovllm.linear_pack(torch.randn(40, 48, dtype=torch.bfloat16))
    weight = torch.randn(64, 48, dtype=torch.bfloat16)
    packed = pack_linear_weight(weight, ours=True)
    with pytest.raises(RuntimeError, match=r"x must be bfloat16 or float32 \[\.\.\., 48\]"):
        packed_linear(torch.randn(2, 47), packed, None)
    x = torch.randn(2, 48)  # fp32 activations over bf16 weights: sums in fp32, the output in x's dtype
    y = packed_linear(x, packed, None)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, F.linear(x, weight.float()), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("make", [lambda w: QKVParallelLinear(64, 16, 4, 2, True, w),
                                  lambda w: MergedColumnParallelLinear(64, [96, 96], False, w)],
                         ids=["qkv_bias", "gate_up"])
def test_packed_method_with_the_kernel_equals_plain(make, linear_tier: str) -> None:
    torch.manual_seed(0)
    plain = make(WeightConfig(torch.bfloat16, CPU, UnquantizedLinearMethod()))
    ours = make(WeightConfig(torch.bfloat16, CPU, PackedLinearMethod(ours=True)))
    with torch.no_grad():
        for name, param in plain.named_parameters():
            param.copy_(torch.randn_like(param, dtype=torch.float32))
            getattr(ours, name).copy_(param)
    ours.method.process_weights_after_loading(ours)
    assert not ours.weight.is_mkldnn and ours.weight.shape[2:] == (64, 2)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert_matches_f_linear(ours(x), x, plain.weight, plain.bias)
    method, head = select_linear_methods("unquantized", None, LinearKernels(dense="folovllm"))
    assert isinstance(method, PackedLinearMethod) and method.ours and head.ours


TINY = dict(architectures=["LlamaForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, eos_token_id=2, tie_word_embeddings=True)


@needs_kernel
def test_loader_packs_linears_and_the_tied_head_for_the_kernel(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    models = {}
    for linear in ("folovllm", "torch"):
        with switches(CPU_LINEAR=linear):
            models[linear == "folovllm"] = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16,
                                                      device="cpu", seed=1, platform=platform_for("cpu"))
    for on, model in models.items():
        linears = [m for m in model.modules() if isinstance(m, LinearBase)]
        assert linears and all((m.weight.dim() == 4) == on for m in linears)  # the head too
    # tied: the packed head is the table's only copy (the lookup reads its rows back), as one plain table is
    embed = models[True].model.embed_tokens
    assert isinstance(embed.row_table, PackedRows) and not hasattr(embed, "weight")
    assert models[True].weight_bytes() == models[False].weight_bytes()
    ids = torch.tensor([[0, 63, 64], [255, 130, 1]])  # block edges, and a 2-d batch of ids
    hidden = torch.randn(3, TINY["hidden_size"], dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(embed(ids), models[False].model.embed_tokens(ids))
        torch.testing.assert_close(models[True].compute_logits(hidden), models[False].compute_logits(hidden),
                                   rtol=BF16_ULP, atol=1e-6)


@needs_kernel
def test_switch_reaches_the_model_and_keeps_greedy_tokens(tiny_llama_dir) -> None:  # noqa: F811
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, seed=3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = {}
    for linear in ("folovllm", "torch"):
        with switches(CPU_LINEAR=linear):
            llm = make_llm(tiny_llama_dir, dtype="bfloat16", max_num_batched_tokens=32)
        linears = [m for m in llm.llm_engine.worker.model.modules() if isinstance(m, LinearBase)]
        assert all((m.weight.dim() == 4) == (linear == "folovllm") for m in linears)
        tokens[linear] = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens["folovllm"] == tokens["torch"]


def test_auto_picks_ours_only_where_it_runs(monkeypatch) -> None:
    kernels = platform_for("cpu").linear_kernels(torch.bfloat16)
    assert kernels.dense == ("folovllm" if NOT_AVAILABLE is None else kernels.dense_fallback)
    assert platform_for("cpu").linear_kernels(torch.float16).dense != "folovllm"  # no fp16 form
    with switches(CPU_ISA="none"):
        assert platform_for("cpu").linear_kernels(torch.bfloat16).dense != "folovllm"
        with pytest.raises(RuntimeError, match="FOLOVLLM_CPU_LINEAR=folovllm, but our linear kernel"):
            with switches(CPU_LINEAR="folovllm"):
                platform_for("cpu").linear_kernels(torch.bfloat16)


@needs_kernel
@pytest.mark.slow
def test_default_model_greedy_tokens_with_and_without_the_kernel() -> None:
    """A sum in another order may move a logit by one bf16 step, so a near-tie can flip a token after
    which the outputs part ways; tests/tolerance.py's top-2 rule tells such a flip from a bug."""
    prompts = ["The capital of France is", "def fibonacci(n):", "List three colors:\n1.",
               "Summarize: " + " ".join(f"Item {i} is a {c} box." for i, c in enumerate(["red", "blue"] * 10))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    runs = {}
    for on in (True, False):
        with switches(CPU_LINEAR="folovllm" if on else "torch"):
            # the dense linears: by default the GGUF file's own types run, which no dense kernel touches
            llm = LLM(dtype="bfloat16", device="cpu", max_model_len=256, kv_cache_memory="64MiB",
                      max_num_batched_tokens=64, load_quantized="off")
        runs[on] = []
        for out in llm.generate(prompts, params, use_tqdm=False):
            top2 = [sorted((lp.logprob for lp in step.values()), reverse=True) for step in out.outputs[0].logprobs]
            runs[on].append((out.outputs[0].token_ids, [a - b for a, b in top2]))
        del llm
    for (tokens, _), (ref_tokens, ref_gaps) in zip(runs[True], runs[False]):
        assert_greedy_match(tokens, ref_tokens, ref_gaps, BF16_TOP2_TOLERANCE)
