"""A tiny transformers model written as llama.cpp's converter writes its GGUF: llama.cpp's tensor names, F32,
the metadata our loader reads; what an architecture changes (norm offsets, q/k row order) passed in."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import gguf
import numpy as np
import torch


def write_hf_gguf(hf_model: torch.nn.Module, path: Path, arch: str, block_names: Mapping[str, str],
                  rope_theta: float, tensor_fn: Callable[[str, torch.Tensor], torch.Tensor] = lambda _, t: t,
                  extra: Mapping[str, np.ndarray] | None = None, sliding_window: int | None = None) -> None:
    """``hf_model``'s tensors (the tied head left out) under llama.cpp's names (``block_names``: HF module ->
    llama.cpp's), each through ``tensor_fn(hf_name, tensor)``; ``extra`` tensors written as given."""
    config = hf_model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(rope_theta)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    writer.add_vocab_size(config.vocab_size)
    for name, data in (extra or {}).items():
        writer.add_tensor(name, data)
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            module, kind = rest.rsplit(".", 1)
            gguf_name = f"blk.{layer}.{block_names[module]}.{kind}"
        writer.add_tensor(gguf_name, tensor_fn(name, tensor.float()).contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
