"""Write a GPTQ checkpoint folder: model.safetensors, config.json, tokenizer and generation config.

Tensor names are the HF ones (``model.layers.N.self_attn.q_proj.qweight``): the merged q/k/v and
gate/up linears of our model are split back into their checkpoint pieces. Embeddings, norms and an
untied LM head stay plain float16 tensors.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerBase

from folovllm.model.arch import ArchConfig
from folovllm.model.layers import CausalLM
from folovllm.model.layers.linear import LinearBase, MergedColumnParallelLinear
from folovllm.quantize.checkpoint import gptq_tensors
from folovllm.quantize.grid import QuantizedWeight

PLAIN_DTYPE = torch.float16
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
# files next to an HF model that describe its tokenizer and generation defaults
_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
               "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
               "generation_config.json")


def checkpoint_pieces(model: CausalLM, name: str, module: LinearBase) -> list[tuple[str, int]]:
    """(HF name, output rows) of each checkpoint linear a module of ours holds, in row order."""
    if not isinstance(module, MergedColumnParallelLinear):
        return [(name, module.output_size)]
    prefix, _, leaf = name.rpartition(".")
    by_shard = {shard: piece for piece, (stacked, shard) in model.stacked_params.items() if stacked == leaf}
    return [(f"{prefix}.{by_shard[shard]}", size) for shard, size in zip(module.shard_ids(), module.output_sizes)]


def checkpoint_tensors(model: CausalLM, quantized: dict[str, QuantizedWeight], bits: int) -> dict[str, torch.Tensor]:
    """Every tensor of the GPTQ checkpoint: packed linears (and their biases) plus the plain tensors."""
    modules = dict(model.named_modules())
    tensors: dict[str, torch.Tensor] = {}
    for name, weight in quantized.items():
        module = modules[name]
        pieces = checkpoint_pieces(model, name, module)
        sizes = [size for _, size in pieces]
        biases = module.bias.split(sizes) if module.bias is not None else [None] * len(pieces)
        for (piece, _), part, bias in zip(pieces, weight.split_rows(sizes), biases, strict=True):
            tensors.update(gptq_tensors(piece, part, bits))
            if bias is not None:
                tensors[f"{piece}.bias"] = bias.to(PLAIN_DTYPE).contiguous()
    for name, param in model.named_parameters():
        if name.rpartition(".")[0] not in quantized:
            tensors[name] = param.detach().to(PLAIN_DTYPE).contiguous()
    return tensors


def hf_config_from_arch(arch: ArchConfig, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """An HF config.json for a model read from a GGUF file (which carries no config.json)."""
    if arch.architecture not in _MODEL_TYPES:
        raise ValueError(f"cannot write an HF config for {arch.architecture!r}; supported: {sorted(_MODEL_TYPES)}")
    config: dict[str, Any] = {
        "architectures": [arch.architecture],
        "model_type": _MODEL_TYPES[arch.architecture],
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_hidden_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": arch.eos_token_ids[0] if len(arch.eos_token_ids) == 1 else arch.eos_token_ids,
    }
    if arch.rope_scaling is not None:
        if arch.rope_scaling["rope_type"] == "freq_factors":
            raise ValueError("the GGUF's rope scaling is per-frequency factors (rope_freqs), which an HF config "
                             "cannot state")
        config["rope_scaling"] = dict(arch.rope_scaling)
    if config["model_type"] == "llama":
        if arch.attention_bias != arch.attention_out_bias:
            raise ValueError("an HF Llama config has one attention_bias flag; this model has a q/k/v bias "
                             "but no o_proj bias (or the reverse)")
        config["attention_bias"] = arch.attention_bias
    return config


def write_folder(
    out: str,
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any],
    source: str,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Write ``out``: the tensors, ``config`` as config.json, and the source's tokenizer files.

    A GGUF source has its tokenizer (with chat template) saved by transformers and a generation
    config made from its special tokens; a folder's own files are copied as they are.
    """
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    # the plain tensors and scales are float16 (transformers 5 names the field "dtype", 4 "torch_dtype")
    config = {key: value for key, value in config.items() if key != "dtype"} | {"torch_dtype": "float16"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if source.endswith(".gguf"):
        tokenizer.save_pretrained(out)
        generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")}
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump(generation, f, indent=2)
        return
    folder = source if os.path.isdir(source) else os.path.dirname(source)
    for name in _SIDE_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            shutil.copyfile(os.path.join(folder, name), os.path.join(out, name))
