"""The checkpoint walk: HF names -> (parameter, shard) through the model's mapping; clear errors; bytes."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from folovllm.attention.torch_backend import TorchAttentionBackend
from folovllm.model.arch import ArchConfig
from folovllm.model.layers.linear import WeightConfig
from folovllm.model.layers.weights import (
    checkpoint_target,
    process_weights_after_loading,
    weight_bytes,
)
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod
from folovllm.model.qwen3 import Qwen3ForCausalLM
from tests.model.test_linear import TransposedLinearMethod
from tests.model.test_loader import prefill_logits

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def hf_state(request: pytest.FixtureRequest) -> tuple[ArchConfig, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = Qwen3Config(**TINY, tie_word_embeddings=request.param)
    state = AutoModelForCausalLM.from_config(config).state_dict()
    arch = ArchConfig.from_hf_config({**config.to_dict(), "architectures": ["Qwen3ForCausalLM"]}, name="tiny")
    return arch, {name: 0.1 * torch.randn_like(t) if "norm" not in name else t for name, t in state.items()}


def build(arch: ArchConfig, method: UnquantizedLinearMethod | None = None) -> Qwen3ForCausalLM:
    weights = WeightConfig(torch.float32, torch.device("cpu"), method or UnquantizedLinearMethod())
    return Qwen3ForCausalLM(arch, TorchAttentionBackend(), weights)


def test_checkpoint_names_map_to_stacked_shards() -> None:
    model = build(ArchConfig.from_hf_config({**TINY, "architectures": ["Qwen3ForCausalLM"]}))
    assert checkpoint_target(model, "model.layers.3.self_attn.k_proj.weight") == (
        "model.layers.3.self_attn.qkv_proj.weight", "k")
    assert checkpoint_target(model, "model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.gate_up_proj.weight", 1)
    assert checkpoint_target(model, "model.layers.0.self_attn.o_proj.weight") == (
        "model.layers.0.self_attn.o_proj.weight", None)


def test_loads_every_tensor_into_its_slice(hf_state: tuple[ArchConfig, dict[str, torch.Tensor]]) -> None:
    arch, state = hf_state
    model = build(arch)
    model.load_weights(state.items())
    attn = model.model.layers[1].self_attn
    prefix = "model.layers.1.self_attn"
    expected = torch.cat([state[f"{prefix}.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.weight, expected)
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(gate_up[: TINY["intermediate_size"]], state["model.layers.0.mlp.gate_proj.weight"])
    assert (model.lm_head.tied is model.model.embed_tokens) == arch.tie_word_embeddings


def test_weight_bytes_counts_parameters_and_buffers_once(hf_state: tuple[ArchConfig, dict]) -> None:
    arch, _ = hf_state
    fp32 = build(arch)
    params = sum(p.numel() for p in fp32.parameters())
    rope = fp32.model.rotary_emb.cos_sin.numel() * 4  # the table stays fp32
    assert fp32.weight_bytes() == params * 4 + rope
    bf16 = Qwen3ForCausalLM(arch, TorchAttentionBackend(), WeightConfig(torch.bfloat16, torch.device("cpu")))
    assert bf16.weight_bytes() == params * 2 + rope
    shared = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False))
    shared[1].weight = shared[0].weight  # tied: one tensor held twice
    assert weight_bytes(shared) == 16 * 4


def test_unknown_misshaped_and_missing_tensors_are_named(hf_state: tuple[ArchConfig, dict]) -> None:
    arch, state = hf_state
    with pytest.raises(ValueError, match="'model.layers.0.mlp.experts.weight' matches no parameter of Qwen3"):
        build(arch).load_weights([*state.items(), ("model.layers.0.mlp.experts.weight", torch.zeros(1))])
    bad = dict(state, **{"model.layers.0.self_attn.k_proj.weight": torch.zeros(8, 32)})
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 32\), "
                                         r"expected \(16, 32\)"):
        build(arch).load_weights(bad.items())
    partial = {k: v for k, v in state.items() if "layers.1.self_attn.v_proj" not in k}
    with pytest.raises(ValueError, match=r"missing 1 tensors.*layers.1.self_attn.qkv_proj.weight', 'v'"):
        build(arch).load_weights(partial.items())


def test_a_new_linear_method_needs_no_model_change(hf_state: tuple[ArchConfig, dict]) -> None:
    arch, state = hf_state
    plain, packed = build(arch), build(arch, TransposedLinearMethod())
    for model in (plain, packed):
        model.load_weights(state.items())
        process_weights_after_loading(model)
    assert packed.model.layers[0].self_attn.qkv_proj.weight.shape == (32, 64)
    ids = [5, 17, 3, 60, 42, 7, 9]
    torch.testing.assert_close(prefill_logits(packed, ids), prefill_logits(plain, ids))
