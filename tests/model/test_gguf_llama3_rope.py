"""A Llama 3 GGUF as llama.cpp's converter writes it: its rope scaling is no metadata key but a ``rope_freqs``
tensor (one divisor per frequency); the model read from it matches transformers' Llama with llama3 scaling."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from folovllm.model.layers import rope_inv_freq
from folovllm.model.loader import load_model
from tests.helpers import BlockPool
from tests.model.hf_gguf import write_hf_gguf
from tests.model.test_model_vs_hf import CONFIGS, NUM_BLOCKS, Seq, hf_logits, new_kv_caches, run_step

torch.set_num_threads(2)

PROMPT = [5, 17, 200, 3, 99, 42, 7, 128, 64, 250, 11, 31, 77, 8, 150, 23, 61, 190, 4, 222] * 2
_BLOCK_NAMES = {  # llama.cpp's names for Llama tensors
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def permute_qk(weights: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's converter's q/k row order: per head, rows (pair, half) -> (half, pair)."""
    return weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, -1).transpose(1, 2).reshape(weights.shape)


def write_llama_gguf(hf_model: torch.nn.Module, path: Path, rope_freqs: bool = True) -> None:
    """The model under llama.cpp's names and q/k order, F32; its llama3 rope scaling as ``rope_freqs``: the
    default frequencies over transformers' scaled ones (no scaling metadata, as the converter writes it)."""
    config = hf_model.config
    theta = config.rope_parameters["rope_theta"]
    heads = {"self_attn.q_proj": config.num_attention_heads, "self_attn.k_proj": config.num_key_value_heads}

    def llama_cpp_rows(name: str, tensor: torch.Tensor) -> torch.Tensor:
        module = name.rpartition(".")[0].split(".", 3)[-1]
        return permute_qk(tensor, heads[module]) if module in heads else tensor

    default = rope_inv_freq(config.head_dim, theta, None)
    extra = {"rope_freqs.weight": (default / hf_model.model.rotary_emb.inv_freq.float()).numpy()} if rope_freqs else {}
    write_hf_gguf(hf_model, path, "llama", _BLOCK_NAMES, theta, llama_cpp_rows, extra)


@pytest.fixture(scope="module")
def hf_llama3() -> torch.nn.Module:
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(CONFIGS["llama"](), attn_implementation="eager").eval()
    with torch.no_grad():  # larger than the default init, so logits are far from ties
        for name, param in hf_model.named_parameters():
            noise = 0.1 * torch.randn_like(param)
            param.copy_(1 + noise if "norm" in name else noise)
    return hf_model


def our_logits(path: Path) -> torch.Tensor:
    model = load_model(str(path), dtype=torch.float32, device="cpu")
    (logits,) = run_step(model, new_kv_caches(model), BlockPool(NUM_BLOCKS), [Seq(tokens=list(PROMPT))], [len(PROMPT)])
    return logits


def test_rope_freqs_gguf_matches_hf_llama3(hf_llama3: torch.nn.Module, tmp_path: Path) -> None:
    write_llama_gguf(hf_llama3, tmp_path / "llama3.gguf")
    torch.testing.assert_close(our_logits(tmp_path / "llama3.gguf"), hf_logits(hf_llama3, PROMPT),
                               atol=1e-4, rtol=1e-4)


def test_without_rope_freqs_the_logits_differ(hf_llama3: torch.nn.Module, tmp_path: Path) -> None:
    """The factors matter at these positions: the same file without them is another model."""
    write_llama_gguf(hf_llama3, tmp_path / "plain.gguf", rope_freqs=False)
    assert (our_logits(tmp_path / "plain.gguf") - hf_logits(hf_llama3, PROMPT)).abs().max() > 1e-2


def test_freq_factors_of_the_wrong_length_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="3 factors for 8 frequencies"):
        rope_inv_freq(16, 10000.0, {"rope_type": "freq_factors", "factors": [1.0, 2.0, 4.0]})
