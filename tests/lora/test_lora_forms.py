"""LoRA beside the other forms: enabled with no adapter in use, outputs do not change (bf16, the CPU's compiled
forms); a GPTQ 4-bit base takes adapters too (the delta added after the quantized matmul)."""
from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

from folovllm import LoRARequest, SamplingParams
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401
from tests.lora.adapters import ATTN, MLP, hf_greedy, merged_model, write_adapter
from tests.model.quant.test_gptq_loading import make_gptq_model, tiny_llama  # noqa: F401

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def test_enabled_without_adapters_changes_nothing(tiny_llama_dir: str) -> None:  # noqa: F811
    prompts = random_prompts(6, seed=3)
    tokens = {}
    for enabled in (False, True):
        llm = make_llm(tiny_llama_dir, dtype="bfloat16", enable_lora=enabled, max_loras=2)
        tokens[enabled] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert tokens[True] == tokens[False]


def test_gptq_base_takes_an_adapter(tiny_llama, tmp_path: Path) -> None:  # noqa: F811
    gptq_dir, dense_dir = make_gptq_model(tiny_llama, tmp_path, bits=4, group_size=32)
    config = AutoConfig.from_pretrained(dense_dir)
    folder = write_adapter(tmp_path / "a", config, 8, ATTN + MLP, seed=5)
    prompt = [5, 17, 33, 40, 99, 7]
    expected = hf_greedy(merged_model(dense_dir, folder), prompt, 6)
    assert expected != hf_greedy(merged_model(dense_dir, None), prompt, 6)
    llm = make_llm(gptq_dir, enable_lora=True, max_lora_rank=8)
    out = llm.generate([prompt, prompt], GREEDY, lora_request=[LoRARequest("a", 1, str(folder)), None],
                       use_tqdm=False)
    assert out[0].outputs[0].token_ids == expected
    assert out[1].outputs[0].token_ids == hf_greedy(merged_model(dense_dir, None), prompt, 6)


@pytest.mark.slow  # the direct form (the default with LoRA on) is in every test of test_lora_generate.py
@pytest.mark.parametrize("form", ["modules", "direct"])
def test_each_decoder_form_adds_the_deltas(tiny_llama_dir: str, tmp_path: Path, form: str, monkeypatch) -> None:  # noqa: F811
    """The module calls and the direct calls give the same tokens with an adapter (fp32)."""
    monkeypatch.setenv("FOLOVLLM_CPU_DECODER", form)
    config = AutoConfig.from_pretrained(tiny_llama_dir)
    folder = write_adapter(tmp_path / "a", config, 4, ATTN + MLP, seed=7)
    prompt = [9, 8, 7, 6, 5]
    expected = hf_greedy(merged_model(tiny_llama_dir, folder), prompt, 6)
    llm = make_llm(tiny_llama_dir, enable_lora=True, max_lora_rank=4)
    out = llm.generate([prompt], GREEDY, lora_request=LoRARequest("a", 1, str(folder)), use_tqdm=False)
    assert out[0].outputs[0].token_ids == expected


@pytest.mark.parametrize("kernel", ["on", "off"])
def test_kernel_and_torch_forms_equal_the_merged_reference(tiny_llama_dir: str, tmp_path: Path,  # noqa: F811
                                                            kernel: str, monkeypatch) -> None:
    """A mixed batch (two adapters, the base) with the CPU's lora_add kernel and with the torch form it
    replaces (``FOLOVLLM_CPU_LORA_KERNEL=off``): each row equals its merged HF model (fp32)."""
    monkeypatch.setenv("FOLOVLLM_CPU_LORA_KERNEL", kernel)
    config = AutoConfig.from_pretrained(tiny_llama_dir)
    folders = [write_adapter(tmp_path / "a", config, 8, ATTN + MLP, seed=11),
               write_adapter(tmp_path / "b", config, 16, ("q_proj", "down_proj"), seed=12)]
    prompt = [3, 14, 15, 92, 65, 35]
    expected = [hf_greedy(merged_model(tiny_llama_dir, folder), prompt, 6) for folder in [*folders, None]]
    llm = make_llm(tiny_llama_dir, enable_lora=True, max_loras=2, max_lora_rank=16)
    assert (llm.llm_engine.worker.lora.linears[(0, "qkv_proj")].kernel is not None) == (
        kernel == "on" and llm.llm_engine.worker.platform.lora_kernel)
    loras = [LoRARequest("a", 1, str(folders[0])), LoRARequest("b", 2, str(folders[1])), None]
    out = llm.generate([prompt] * 3, GREEDY, lora_request=loras, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == expected
