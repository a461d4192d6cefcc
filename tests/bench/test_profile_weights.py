"""``bench profile``'s weights read per decode step: every linear's and the LM head's bytes, once."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from folovllm.bench.profile import step_weight_bytes
from folovllm.model.loader import load_model
from folovllm.platforms import platform_for

TINY = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32)


@pytest.mark.parametrize("tied", [True, False])
def test_a_step_reads_each_linear_and_the_head_once(tmp_path: Path, tied: bool) -> None:
    """A tied head (packed for our kernel where the host has it: a copy of its own) counts its rows once, and
    the embedding table it was tied to not again."""
    config = LlamaConfig(**TINY, tie_word_embeddings=tied)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(tmp_path)
    model = load_model(str(tmp_path), dtype=torch.bfloat16, device="cpu", platform=platform_for("cpu"))
    hf_names = AutoModelForCausalLM.from_config(config).state_dict()
    linears = sum(t.numel() for n, t in hf_names.items() if n.startswith("model.layers.") and "norm" not in n)
    head = config.vocab_size * config.hidden_size
    assert step_weight_bytes(model) == 2 * (linears + head)
