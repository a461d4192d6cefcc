"""The greedy LM head kernel (``linear_argmax``, csrc/cpu/greedy_head.cpp) against the argmax of our linear
kernel's logits at every tier it has, and ``FOLOVLLM_CPU_GREEDY_HEAD``: when the head offers it (the int8
head's own, int8_argmax, too), and that greedy tokens do not change."""
from __future__ import annotations

import json

import pytest
import torch

from folovllm import SamplingParams
from folovllm.model.loader import load_model
from folovllm.model.quantization.packed import pack_linear_weight, packed_linear
from folovllm.platforms import kernel_library, platform_for
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401
from tests.helpers import switches
from tests.tiers import kernel_missing, skip_unless_kernel

torch.set_num_threads(2)
NOT_AVAILABLE = kernel_missing("linear_argmax")
needs_kernel = pytest.mark.skipif(NOT_AVAILABLE is not None, reason=f"{NOT_AVAILABLE}")


@pytest.fixture
def argmax_tier(kernel_tier: str) -> str:
    skip_unless_kernel("linear_argmax")
    return kernel_tier


def reference_argmax(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return packed_linear(x, packed, None).float().argmax(dim=-1)


@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 13, 64])
@pytest.mark.parametrize("vocab, hidden", [(64, 2), (576, 96), (4096, 64)])
def test_kernel_matches_the_argmax_of_the_linear_kernel(rows: int, vocab: int, hidden: int, argmax_tier: str) -> None:
    torch.manual_seed(rows * 7 + vocab)
    packed = pack_linear_weight(torch.randn(vocab, hidden, dtype=torch.bfloat16), ours=True)
    x = torch.randn(rows, hidden, dtype=torch.bfloat16)
    got = torch.ops.folovllm.linear_argmax(x, packed)
    assert got.dtype == torch.int64 and got.shape == (rows,)
    assert torch.equal(got, reference_argmax(x, packed))


def test_ties_go_to_the_first_token_across_blocks_and_threads(argmax_tier: str) -> None:
    # Equal rows of the weight give equal logits: the lowest id must win, however the work is split.
    weight = torch.randn(1, 32, dtype=torch.bfloat16).repeat(4096, 1)
    weight[:700] *= -1  # ids below 700 lose, 700 is the first maximum (unless a row prefers the others)
    packed = pack_linear_weight(weight, ours=True)
    for rows in (9, 30):  # row groups read the packed weights; a batch of 12 or more widens them first
        x = torch.randn(rows, 32, dtype=torch.bfloat16)
        expected = reference_argmax(x, packed)
        assert set(expected.tolist()) <= {0, 700}
        assert torch.equal(torch.ops.folovllm.linear_argmax(x, packed), expected)


@pytest.mark.parametrize("rows", [1, 7, 40])
def test_claimed_parts_give_the_tokens_of_fixed_shares(rows: int, argmax_tier: str) -> None:
    # linear_claims on: the threads claim runs of vocabulary parts as they go; off: a fixed share each
    torch.manual_seed(rows)
    packed = pack_linear_weight(torch.randn(8192, 64, dtype=torch.bfloat16), ours=True)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    with kernel_library.kernel_switches(linear_claims=False):
        fixed = torch.ops.folovllm.linear_argmax(x, packed)
    with kernel_library.kernel_switches(linear_claims=True):
        assert torch.equal(torch.ops.folovllm.linear_argmax(x, packed), fixed)
    assert torch.equal(fixed, reference_argmax(x, packed))


def test_kernel_rejects_an_unpacked_weight(argmax_tier: str) -> None:
    with pytest.raises(RuntimeError, match="not packed"):
        torch.ops.folovllm.linear_argmax(torch.randn(2, 8, dtype=torch.bfloat16),
                                         torch.randn(64, 8, dtype=torch.bfloat16))


TINY = dict(architectures=["LlamaForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, eos_token_id=2)


def _tiny(path, linear: str = "auto", quantize_lm_head: str = "off"):
    with switches(CPU_LINEAR=linear):
        return load_model(str(path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=1,
                          quantize_lm_head=quantize_lm_head, platform=platform_for("cpu"))


@needs_kernel
@pytest.mark.parametrize("tied", [True, False])
def test_head_is_offered_only_where_it_equals_the_logits_argmax(tmp_path, tied: bool) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "tie_word_embeddings": tied}))
    model = _tiny(tmp_path, "folovllm")
    head = model.greedy_head()
    hidden = torch.randn(11, TINY["hidden_size"], dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(head(hidden), model.compute_logits(hidden).argmax(dim=-1))
    assert _tiny(tmp_path, "torch").greedy_head() is None
    # an int8 head has its own shortcut (int8_argmax), where our int8 kernel runs it
    model = _tiny(tmp_path, "folovllm", quantize_lm_head="on")
    head = model.greedy_head()
    assert (head is None) == (kernel_missing("int8") is not None)
    if head is not None:
        with torch.inference_mode():
            assert torch.equal(head(hidden), model.compute_logits(hidden).argmax(dim=-1))


def test_switch_keeps_greedy_tokens_and_steps_with_logprobs_take_the_sampler(tiny_llama_dir) -> None:  # noqa: F811
    prompts = [{"prompt_token_ids": p} for p in random_prompts(6, seed=5)]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with_logprobs = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    tokens = {}
    for on in (True, False):
        with switches(CPU_GREEDY_HEAD="on" if on else "off"):
            llm = make_llm(tiny_llama_dir, dtype="bfloat16", max_num_batched_tokens=32)
        offered = llm.llm_engine.worker.model.greedy_head() is not None
        assert (llm.llm_engine.worker.runner.greedy_head is not None) == (on and offered)
        tokens[on] = [out.outputs[0].token_ids for out in llm.generate(prompts, greedy, use_tqdm=False)]
        logprob_outputs = llm.generate(prompts[:2], with_logprobs, use_tqdm=False)
        assert all(len(out.outputs[0].logprobs) == 12 for out in logprob_outputs)
        tokens[on] += [out.outputs[0].token_ids for out in logprob_outputs]
    assert tokens[True] == tokens[False]
