"""A tiny random Llama saved with transformers, and a Hugging Face hub cache that holds it.

The cache has the hub's layout (``hub/models--org--name/snapshots/<commit>/...`` and ``refs/main``),
so a hub id resolves from it with no network.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TINY_REPO_ID = "folotest/tiny-llama"
TINY_COMMIT = "0123456789abcdef0123456789abcdef01234567"
# The default model's vocabulary, so its tokenizer (saved beside the weights) fits the model.
TINY_LLAMA = dict(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def save_tiny_llama(folder: Path, tokenizer, generation: dict | None = None, **shape) -> Path:
    """Weights far from ties (std 0.5, so beams never tie), its tokenizer, and a generation config;
    ``shape`` overrides fields of ``TINY_LLAMA``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **shape})).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(1 + 0.1 * torch.randn_like(param) if "norm" in name else 0.5 * torch.randn_like(param))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if generation is not None:
        path = folder / "generation_config.json"
        (path).write_text(json.dumps({**json.loads(path.read_text()), **generation}))
    return folder


def make_hub_cache(hub_dir: Path, repo_id: str, source: Path, commit: str = TINY_COMMIT) -> Path:
    """Copies ``source``'s files into ``hub_dir`` as the hub cache's snapshot of ``repo_id``; returns it."""
    repo = hub_dir / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
