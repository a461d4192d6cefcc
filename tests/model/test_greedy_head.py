"""The greedy LM head kernel (csrc/cpu_greedy_head.cpp) against the argmax of the bf16 linear kernel's
logits, and the ``cpu_greedy_head`` switch: when it applies (the int8 head's own, int8_argmax, too), and that
greedy tokens do not change."""
from __future__ import annotations

import json

import pytest
import torch

import folovllm.config
from folovllm import SamplingParams
from folovllm.config import EngineConfig
from folovllm.kernel_libraries import CPU_BF16_LINEAR_LIBRARY, CPU_GREEDY_HEAD_LIBRARY, load_cpu_bf16_linear_library, load_cpu_greedy_head_library
from folovllm.model.cpu_packed import pack_linear_weight, packed_linear
from folovllm.model.greedy_head import greedy_head_for
from folovllm.model.loader import load_model
from folovllm.model.quant.cpu_quant import cpu_quant_unavailable
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401

torch.set_num_threads(2)
NOT_AVAILABLE = load_cpu_bf16_linear_library(CPU_BF16_LINEAR_LIBRARY) or load_cpu_greedy_head_library(
    CPU_GREEDY_HEAD_LIBRARY)
pytestmark = pytest.mark.skipif(NOT_AVAILABLE is not None, reason=f"{NOT_AVAILABLE}")


def reference_argmax(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return packed_linear(x, packed, None).float().argmax(dim=-1)


@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 13, 64])
@pytest.mark.parametrize("vocab, hidden", [(64, 2), (576, 96), (4096, 64)])
def test_kernel_matches_the_argmax_of_the_linear_kernel(rows: int, vocab: int, hidden: int) -> None:
    torch.manual_seed(rows * 7 + vocab)
    packed = pack_linear_weight(torch.randn(vocab, hidden, dtype=torch.bfloat16), bf16_kernel=True)
    x = torch.randn(rows, hidden, dtype=torch.bfloat16)
    got = torch.ops.folovllm_cpu_head.argmax(x, packed)
    assert got.dtype == torch.int64 and got.shape == (rows,)
    assert torch.equal(got, reference_argmax(x, packed))


def test_ties_go_to_the_first_token_across_blocks_and_threads() -> None:
    # Equal rows of the weight give equal logits: the lowest id must win, however the work is split.
    weight = torch.randn(1, 32, dtype=torch.bfloat16).repeat(4096, 1)
    weight[:700] *= -1  # ids below 700 lose, 700 is the first maximum (unless a row prefers the others)
    packed = pack_linear_weight(weight, bf16_kernel=True)
    x = torch.randn(9, 32, dtype=torch.bfloat16)
    expected = reference_argmax(x, packed)
    assert set(expected.tolist()) <= {0, 700}
    assert torch.equal(torch.ops.folovllm_cpu_head.argmax(x, packed), expected)


def test_kernel_rejects_an_unpacked_weight() -> None:
    with pytest.raises(RuntimeError, match="not packed"):
        torch.ops.folovllm_cpu_head.argmax(torch.randn(2, 8, dtype=torch.bfloat16),
                                           torch.randn(64, 8, dtype=torch.bfloat16))


TINY = dict(architectures=["LlamaForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, eos_token_id=2)


@pytest.mark.parametrize("tied", [True, False])
def test_head_is_found_only_where_it_equals_the_logits_argmax(tmp_path, tied: bool) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "tie_word_embeddings": tied}))
    model = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=1,
                       cpu_prepack=True, cpu_bf16_linear=True)
    head = greedy_head_for(model)
    hidden = torch.randn(11, TINY["hidden_size"], dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(head(hidden), model.compute_logits(hidden).argmax(dim=-1))
    for other in (dict(cpu_bf16_linear=False), dict(cpu_prepack=False)):
        model = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=1,
                           **{"cpu_prepack": True, "cpu_bf16_linear": True, **other})
        assert greedy_head_for(model) is None, other
    # an int8 head has its own shortcut (int8_argmax), where our int8 kernel runs it
    model = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=1,
                       cpu_prepack=True, cpu_bf16_linear=True, quantize_lm_head="on")
    head = greedy_head_for(model)
    assert (head is None) == (cpu_quant_unavailable() is not None)
    if head is not None:
        with torch.inference_mode():
            assert torch.equal(head(hidden), model.compute_logits(hidden).argmax(dim=-1))


def test_switch_keeps_greedy_tokens_and_steps_with_logprobs_take_the_sampler(tiny_llama_dir) -> None:  # noqa: F811
    prompts = [{"prompt_token_ids": p} for p in random_prompts(6, seed=5)]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with_logprobs = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    tokens = {}
    for on in (True, False):
        llm = make_llm(tiny_llama_dir, dtype="bfloat16", cpu_greedy_head=on, max_num_batched_tokens=32)
        assert llm.llm_engine.config.cpu_greedy_head == on
        assert (llm.llm_engine.worker.runner.greedy_head is not None) == on
        tokens[on] = [out.outputs[0].token_ids for out in llm.generate(prompts, greedy, use_tqdm=False)]
        logprob_outputs = llm.generate(prompts[:2], with_logprobs, use_tqdm=False)
        assert all(len(out.outputs[0].logprobs) == 12 for out in logprob_outputs)
        tokens[on] += [out.outputs[0].token_ids for out in logprob_outputs]
    assert tokens[True] == tokens[False]


def test_switch_is_off_without_the_library_or_the_bf16_kernel(tmp_path, monkeypatch, caplog) -> None:
    assert EngineConfig(device="cpu").resolve().cpu_greedy_head
    assert not EngineConfig(device="cpu", cpu_greedy_head=False).resolve().cpu_greedy_head
    assert not EngineConfig(device="cpu", cpu_bf16_linear=False).resolve().cpu_greedy_head
    assert not EngineConfig(device="cpu", dtype="float32").resolve().cpu_greedy_head
    monkeypatch.setattr(folovllm.config, "CPU_GREEDY_HEAD_LIBRARY", tmp_path / "missing.so")
    with caplog.at_level("INFO", logger="folovllm.kernel_libraries"):
        assert not EngineConfig(device="cpu").resolve().cpu_greedy_head
    assert [r.getMessage() for r in caplog.records if "cpu_greedy_head" in r.getMessage()] == [
        f"cpu_greedy_head: off, since the greedy LM head kernel is not built ({tmp_path / 'missing.so'} is "
        "missing): run `make kernels` in the source tree"]
