"""load_model / load_tokenizer: the shipped SmolLM2 GGUF vs transformers, dummy weights, bad input."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from folovllm.model.layers import CausalLM
from folovllm.model.loader import default_model_path, load_arch_config, load_model
from folovllm.model.loader.tokenizer import load_tokenizer
from tests.helpers import make_attn_metadata

torch.set_num_threads(2)

QWEN3_SMALL = {
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "eos_token_id": 151645,
}


def prefill_logits(model: CausalLM, ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits of every position of one prompt, computed through a paged cache of block size 16."""
    arch, block_size = model.arch, 16
    num_blocks = -(-len(ids) // block_size)
    shape = (num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    caches = [
        (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(arch.num_hidden_layers)
    ]
    meta = make_attn_metadata([len(ids)], [len(ids)], [list(range(num_blocks))[::-1]], block_size)
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), caches, meta))


@pytest.fixture(scope="module")
def smollm_fp32() -> CausalLM:
    return load_model(default_model_path(), dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_smollm2_arch(smollm_fp32: CausalLM) -> None:
    arch = smollm_fp32.arch
    assert arch.architecture == "LlamaForCausalLM"
    assert (arch.num_hidden_layers, arch.hidden_size, arch.intermediate_size) == (30, 576, 1536)
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim) == (9, 3, 64)
    assert arch.vocab_size == 49152 and arch.tie_word_embeddings and smollm_fp32.lm_head.tied is not None
    assert arch.rope_theta == 100000.0 and arch.eos_token_ids == [2]


@pytest.fixture(scope="module")
def hf_smollm_fp32() -> torch.nn.Module:
    """transformers' own GGUF loader (dequantize + Q/K unpermute) and Llama code: the reference."""
    folder, filename = os.path.split(default_model_path())
    return AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=filename, dtype=torch.float32, local_files_only=True
    ).eval()


def hf_logits(hf_model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([ids])).logits[0].float()


def test_smollm2_logits_match_transformers(
    smollm_fp32: CausalLM, hf_smollm_fp32: torch.nn.Module, prompt_ids: list[int]
) -> None:
    ours = prefill_logits(smollm_fp32, prompt_ids)
    torch.testing.assert_close(ours, hf_logits(hf_smollm_fp32, prompt_ids), atol=2e-3, rtol=1e-4)


@pytest.mark.slow  # the bf16 twin of test_smollm2_logits_match_transformers
def test_smollm2_bf16(hf_smollm_fp32: torch.nn.Module, prompt_ids: list[int]) -> None:
    model = load_model(default_model_path(), dtype=torch.bfloat16, device="cpu")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    ours = prefill_logits(model, prompt_ids, torch.bfloat16)
    # bf16 vs fp32 differs by ~1 logit here, so the reference is transformers run in bf16 too,
    # with its rotary inv_freq kept in fp32 as from_pretrained(dtype=bf16) would
    hf_bf16 = copy.deepcopy(hf_smollm_fp32).to(torch.bfloat16)
    for module, source in zip(hf_bf16.modules(), hf_smollm_fp32.modules()):
        if hasattr(source, "inv_freq"):
            module.inv_freq = source.inv_freq.clone()
    expected = hf_logits(hf_bf16, prompt_ids)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, atol=0.1, rtol=0.02)
    assert ours[-1].argmax() == expected[-1].argmax()


def test_tokenizer_has_chat_template(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
    assert tokenizer.chat_template and tokenizer.eos_token_id == 2
    assert tokenizer.decode(prompt_ids).startswith("<|im_start|>system")


def test_dummy_qwen3_from_config(tmp_path: Path) -> None:
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(QWEN3_SMALL))
    model = load_model(str(config_path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=3)
    arch = model.arch
    assert arch.architecture == "Qwen3ForCausalLM" and arch.head_dim == 64 and arch.eos_token_ids == [151645]
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 64, 128)
    assert layer.self_attn.o_proj.weight.shape == (128, 4 * 64)
    assert layer.self_attn.q_norm is not None and layer.mlp.gate_up_proj.weight.shape == (2 * 384, 128)
    assert model.lm_head.tied is not None and layer.self_attn.qkv_proj.bias is None
    std = model.model.embed_tokens.weight.float().std().item()
    assert 0.015 < std < 0.025
    logits = prefill_logits(model, [1, 2, 3, 4, 5], torch.bfloat16)
    assert logits.shape == (5, 512) and torch.isfinite(logits).all()

    same = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=3)
    assert torch.equal(same.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_position_tables_stop_at_the_served_length(tmp_path: Path) -> None:
    """max_positions (the engine's max_model_len) caps the rotary table; the rows it keeps are the same."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_SMALL))
    full = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=3)
    short = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=3,
                       max_positions=100)
    assert full.model.rotary_emb.cos_sin.shape[0] == 1024 and short.model.rotary_emb.cos_sin.shape[0] == 100
    assert short.arch.max_position_embeddings == 100
    assert torch.equal(short.model.rotary_emb.cos_sin, full.model.rotary_emb.cos_sin[:100])
    ids = list(range(1, 40))
    assert torch.equal(prefill_logits(short, ids, torch.bfloat16), prefill_logits(full, ids, torch.bfloat16))
    longer = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16, device="cpu", seed=3,
                        max_positions=4096)  # past the model's maximum: the engine refuses that length
    assert longer.model.rotary_emb.cos_sin.shape[0] == 1024


def test_engine_builds_position_tables_for_its_max_model_len(tmp_path: Path) -> None:
    from folovllm import LLM

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_SMALL))
    llm = LLM(str(tmp_path), load_format="dummy", dtype="bfloat16", max_model_len=200, num_gpu_blocks_override=64)
    assert llm.llm_engine.max_model_len == 200
    assert llm.llm_engine.worker.model.model.rotary_emb.cos_sin.shape[0] == 200
    with pytest.raises(ValueError, match="exceeds the model's maximum of 1024"):
        LLM(str(tmp_path), load_format="dummy", dtype="bfloat16", max_model_len=2000, num_gpu_blocks_override=64)


def test_tokenizer_falls_back_for_dummy_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_SMALL))
    assert load_tokenizer(str(tmp_path)).eos_token_id == 2


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_model(str(tmp_path / "nope.gguf"), dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="never downloaded"):
        load_model("HuggingFaceTB/SmolLM2-135M", dtype=torch.float32, device="cpu")


def test_unknown_architecture_lists_supported(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_SMALL, "architectures": ["FooForCausalLM"]}))
    with pytest.raises(ValueError, match=r"'FooForCausalLM' is not supported.*LlamaForCausalLM"):
        load_model(str(tmp_path), load_format="dummy", dtype=torch.float32, device="cpu")


def test_missing_safetensors_and_bad_format(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_SMALL))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="unknown load_format"):
        load_model(str(tmp_path), load_format="pt", dtype=torch.float32, device="cpu")


def test_arch_config_reads_old_rope_theta(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_SMALL))
    assert load_arch_config(str(tmp_path)).rope_theta == 1e6
    new_style = {**QWEN3_SMALL, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    (tmp_path / "config.json").write_text(json.dumps(new_style))
    arch = load_arch_config(str(tmp_path))
    assert arch.rope_theta == 5e5 and arch.rope_scaling is None


def test_arch_config_missing_fields_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}))
    with pytest.raises(ValueError, match="lacks required fields.*vocab_size"):
        load_arch_config(str(tmp_path))


def test_quantized_checkpoint_names_its_unsupported_method(tmp_path: Path) -> None:
    config = {**QWEN3_SMALL, "quantization_config": {"quant_method": "awq", "bits": 4}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_arch_config(str(tmp_path)).quantization == "awq"
    with pytest.raises(ValueError, match=r"quantization 'awq' is not supported; supported: \[.*'gptq'.*'unquantized'"):
        load_model(str(tmp_path), load_format="dummy", dtype=torch.float32, device="cpu")


def test_dummy_gptq_model_runs(tmp_path: Path) -> None:
    config = {**QWEN3_SMALL, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(str(tmp_path), load_format="dummy", dtype=torch.float32, device="cpu")
    assert model.arch.quantization == "gptq"
    assert torch.isfinite(prefill_logits(model, [1, 2, 3])).all()


def test_hf_overrides_need_a_config_json() -> None:
    from folovllm.model.loader import load_arch_config

    with pytest.raises(ValueError, match="hf_overrides change a model's config.json"):
        load_arch_config("model.gguf", {"max_position_embeddings": 64})
