"""The config.json written for a GGUF source reads back as the same architecture."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from folovllm.model.arch import ArchConfig
from folovllm.quantize.folder import hf_config_from_arch

SMOLLM2_LIKE = ArchConfig(
    architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536,
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
    rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True, eos_token_ids=[2],
    name="SmolLM2-135M-Instruct.Q4_1.gguf",
)


def test_hf_config_round_trips_the_architecture() -> None:
    config = hf_config_from_arch(SMOLLM2_LIKE, SimpleNamespace(bos_token_id=1))
    assert config["model_type"] == "llama" and config["bos_token_id"] == 1 and config["eos_token_id"] == 2
    back = ArchConfig.from_hf_config(config, name=SMOLLM2_LIKE.name)
    assert back == SMOLLM2_LIKE


def test_rope_scaling_and_qwen2() -> None:
    arch = ArchConfig(**{**SMOLLM2_LIKE.__dict__, "architecture": "Qwen2ForCausalLM", "attention_bias": True,
                         "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "eos_token_ids": [2, 7]})
    config = hf_config_from_arch(arch, SimpleNamespace(bos_token_id=None))
    assert config["model_type"] == "qwen2" and "attention_bias" not in config  # Qwen2 fixes its own biases
    back = ArchConfig.from_hf_config(config, name=arch.name)
    assert back.rope_scaling == {"rope_type": "linear", "factor": 2.0} and back.eos_token_ids == [2, 7]


def test_per_frequency_rope_factors_have_no_hf_config() -> None:
    arch = ArchConfig(**{**SMOLLM2_LIKE.__dict__, "rope_scaling": {"rope_type": "freq_factors", "factors": [1.0] * 32}})
    with pytest.raises(ValueError, match="per-frequency factors"):
        hf_config_from_arch(arch, SimpleNamespace(bos_token_id=1))


def test_a_llama_with_a_qkv_bias_but_no_o_bias_has_no_hf_config() -> None:
    arch = ArchConfig(**{**SMOLLM2_LIKE.__dict__, "attention_bias": True, "attention_out_bias": False})
    with pytest.raises(ValueError, match="one attention_bias flag"):
        hf_config_from_arch(arch, SimpleNamespace(bos_token_id=1))
