"""Gemma 3 vs transformers' own Gemma3ForCausalLM on a tiny random checkpoint whose sliding window (4)
is shorter than the prompts, through the paged KV cache on every CPU attention backend."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from folovllm.model.arch import FULL, SLIDING, ArchConfig
from folovllm.model.layers import CausalLM
from folovllm.model.loader import load_model
from tests.helpers import BlockPool, use_triton_interpreter_without_cuda
from tests.model.hf_gguf import write_hf_gguf
from tests.model.test_model_vs_hf import (
    NUM_BLOCKS,
    Seq,
    hf_logits,
    new_kv_caches,
    run_step,
)
from tests.tiers import library_missing

torch.set_num_threads(2)

WINDOW = 4
LAYER_TYPES = [SLIDING, SLIDING, FULL, SLIDING, FULL]
PROMPT = [5, 17, 200, 3, 99, 42, 7, 128, 64, 250, 11, 31, 77]
NOT_BUILT = library_missing()
BACKENDS = [
    "torch",
    pytest.param("cpu", marks=pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")),
    "triton",  # in Triton's interpreter on CPU
]


def tiny_gemma3_config(**overrides) -> Gemma3TextConfig:
    """Both layer types, every Gemma 3 knob away from its default so that each one is exercised."""
    fields = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        sliding_window=WINDOW, layer_types=LAYER_TYPES, query_pre_attn_scalar=24, final_logit_softcapping=30.0,
        rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": 100.0},
                         FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
        eos_token_id=1, bos_token_id=2, pad_token_id=0,
    )
    return Gemma3TextConfig(**{**fields, **overrides})


def random_hf_model(config: Gemma3TextConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # norms near 0 (they scale by 1 + weight); other weights large enough to avoid ties
        for name, param in model.named_parameters():
            param.copy_((0.1 if "norm" in name else 0.3) * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    hf_model = random_hf_model(tiny_gemma3_config())
    path = tmp_path_factory.mktemp("tiny_gemma3")
    hf_model.save_pretrained(path, safe_serialization=True)
    return path, hf_model


def load(path: Path, backend: str) -> CausalLM:
    if backend == "triton":
        use_triton_interpreter_without_cuda()
    return load_model(str(path), dtype=torch.float32, device="cpu", attn_backend=backend)


def test_arch_config_reads_layer_types_window_and_both_ropes(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    arch = load_model(str(checkpoint[0]), dtype=torch.float32, device="cpu").arch
    assert arch.layer_types == LAYER_TYPES and arch.sliding_window == WINDOW
    assert [arch.layer_sliding_window(i) for i in range(5)] == [WINDOW, WINDOW, None, WINDOW, None]
    assert (arch.rope_theta, arch.rope_local_theta) == (10000.0, 100.0)
    assert arch.rope_scaling == {"rope_type": "linear", "factor": 2.0} and arch.rope_local_scaling is None
    assert (arch.hidden_act, arch.query_pre_attn_scalar, arch.final_logit_softcapping) == ("gelu_pytorch_tanh", 24, 30.0)


def test_transformers4_config_fields() -> None:
    # older configs: one rope_theta, rope_local_base_freq, a pattern instead of layer_types, global-only scaling
    config = dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=256, hidden_size=64,
                  intermediate_size=128, num_hidden_layers=7, num_attention_heads=4, head_dim=16,
                  rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0},
                  sliding_window=512, sliding_window_pattern=3)
    arch = ArchConfig.from_hf_config(config)
    assert arch.layer_types == [SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING]
    assert (arch.rope_theta, arch.rope_local_theta, arch.sliding_window) == (1e6, 1e4, 512)
    assert arch.rope_scaling == {"rope_type": "linear", "factor": 8.0} and arch.rope_local_scaling is None
    del config["sliding_window_pattern"]  # Gemma 3's own default: every 6th layer global
    assert ArchConfig.from_hf_config(config).layer_types == [SLIDING] * 5 + [FULL, SLIDING]


def test_attention_softcapping_is_refused() -> None:
    config = tiny_gemma3_config(attn_logit_softcapping=50.0).to_dict()
    config["architectures"] = ["Gemma3ForCausalLM"]
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        ArchConfig.from_hf_config(config)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_and_decode_match_hf(checkpoint: tuple[Path, torch.nn.Module], backend: str) -> None:
    path, hf_model = checkpoint
    model = load(path, backend)
    kv_caches, pool = new_kv_caches(model), BlockPool(NUM_BLOCKS)
    seq = Seq(tokens=list(PROMPT))
    (logits,) = run_step(model, kv_caches, pool, [seq], [len(seq.tokens)])
    torch.testing.assert_close(logits, hf_logits(hf_model, seq.tokens), atol=1e-4, rtol=1e-4)
    for _ in range(6 if backend == "triton" else 16):  # decode well past the window
        seq.tokens.append(int(logits[-1].argmax()))
        (logits,) = run_step(model, kv_caches, pool, [seq], [1])
        expected = hf_logits(hf_model, seq.tokens)[-1:]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
        assert int(logits[-1].argmax()) == int(expected[-1].argmax())


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_beside_a_decode_matches_hf(checkpoint: tuple[Path, torch.nn.Module], backend: str) -> None:
    path, hf_model = checkpoint
    model = load(path, backend)
    caches, pool = new_kv_caches(model), BlockPool(NUM_BLOCKS, seed=1)
    a, b = Seq(list(PROMPT)), Seq([9, 8, 7, 6, 5, 4, 3])
    run_step(model, caches, pool, [a, b], [3, 7])  # A's first chunk is shorter than the window
    b.tokens.append(9)
    chunk_a, step_b = run_step(model, caches, pool, [a, b], [6, 1])  # crosses the window over cached context
    last_a, = run_step(model, caches, pool, [a], [4])
    torch.testing.assert_close(chunk_a, hf_logits(hf_model, PROMPT)[3:9], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(last_a, hf_logits(hf_model, PROMPT)[9:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(step_b, hf_logits(hf_model, b.tokens)[-1:], atol=1e-4, rtol=1e-4)


def test_the_window_changes_the_logits(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    # the same weights with a window longer than the prompt: the comparisons above catch a missing window
    path, hf_model = checkpoint
    wide = random_hf_model(tiny_gemma3_config(sliding_window=1000))
    wide.load_state_dict(hf_model.state_dict())
    windowed, unwindowed = hf_logits(hf_model, PROMPT), hf_logits(wide, PROMPT)
    torch.testing.assert_close(windowed[:WINDOW], unwindowed[:WINDOW], atol=1e-5, rtol=1e-5)
    assert (windowed[WINDOW:] - unwindowed[WINDOW:]).abs().max() > 1e-2


_GGUF_BLOCK_NAMES = {  # llama.cpp's names for Gemma 3 tensors
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def write_gemma3_gguf(hf_model: torch.nn.Module, path: Path) -> None:
    """The model as llama.cpp's converter writes it: its tensor names, norms stored as 1 + weight,
    no layer pattern, local rope base or query scalar in the metadata (fixed by the architecture)."""
    config = hf_model.config
    write_hf_gguf(hf_model, path, "gemma3", _GGUF_BLOCK_NAMES, config.rope_parameters[FULL]["rope_theta"],
                  lambda name, t: t + 1.0 if name.endswith("norm.weight") else t,
                  sliding_window=config.sliding_window)


def test_gguf_with_llama_cpp_conventions_matches_hf(tmp_path: Path) -> None:
    # llama.cpp's gemma3 facts: every 6th layer global, local rope base 10000, scores scaled by head_dim
    config = tiny_gemma3_config(num_hidden_layers=7, layer_types=None, query_pre_attn_scalar=16,
                                final_logit_softcapping=None,
                                rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                                                 FULL: {"rope_type": "default", "rope_theta": 1e6}})
    hf_model = random_hf_model(config)
    write_gemma3_gguf(hf_model, tmp_path / "tiny-gemma3.gguf")
    model = load_model(str(tmp_path / "tiny-gemma3.gguf"), dtype=torch.float32, device="cpu")
    assert model.arch.layer_types == [SLIDING] * 5 + [FULL, SLIDING] and model.arch.sliding_window == WINDOW
    kv_caches, pool = new_kv_caches(model), BlockPool(NUM_BLOCKS)
    (logits,) = run_step(model, kv_caches, pool, [Seq(tokens=list(PROMPT))], [len(PROMPT)])
    torch.testing.assert_close(logits, hf_logits(hf_model, PROMPT), atol=1e-4, rtol=1e-4)
