"""PEFT LoRA adapters read from disk and checked against the base model's linears.

A PEFT folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ``use_rslora``)
and ``adapter_model.safetensors`` with, per targeted linear, ``...layers.N.self_attn.q_proj.lora_A.weight``
[r, in] and ``...lora_B.weight`` [out, r]. Our decoder merges q/k/v into ``qkv_proj`` and gate/up into
``gate_up_proj``: a piece's B adds to its rows of the merged output only. Anything that
does not fit the model (a rank above ``max_lora_rank``, a module we do not hold, a shape, a PEFT option
we do not implement) is a ValueError naming it.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import torch
from safetensors import safe_open

from folovllm.lora.request import LoRARequest
from folovllm.model.arch import ArchConfig

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"

# checkpoint module -> (our merged linear, the piece's index in it; None: the whole output)
TARGETS: dict[str, tuple[str, int | None]] = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2), "qkv_proj": ("qkv_proj", None),
    "o_proj": ("o_proj", None),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1), "gate_up_proj": ("gate_up_proj", None),
    "down_proj": ("down_proj", None),
}
_KEY = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# PEFT settings whose non-default value changes the math: refused rather than ignored
_UNSUPPORTED = {"use_dora": False, "fan_in_fan_out": False, "modules_to_save": None, "layers_to_transform": None,
                "rank_pattern": {}, "alpha_pattern": {}, "lora_bias": False}


def linear_pieces(arch: ArchConfig) -> dict[str, tuple[int, list[int]]]:
    """Each LoRA-capable linear of a decoder layer: (in features, its pieces' out features)."""
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    hidden, inter = arch.hidden_size, arch.intermediate_size
    return {"qkv_proj": (hidden, [q, kv, kv]), "o_proj": (q, [hidden]),
            "gate_up_proj": (hidden, [inter, inter]), "down_proj": (inter, [hidden])}


@dataclass(frozen=True)
class BPiece:
    """One targeted piece's B [rows, r] (scale folded in): it adds to outputs ``[row, row + rows)`` from
    A's rows ``[column, column + r)``."""

    row: int
    column: int
    weight: torch.Tensor


LinearLoRA = tuple[torch.Tensor, tuple[BPiece, ...]]  # A [R, in] (the pieces' A stacked), their B pieces


@dataclass
class LoRAAdapter:
    """An adapter's weights per (layer, our linear): the pieces it targets there (see ``BPiece``)."""

    request: LoRARequest
    rank: int
    scaling: float
    weights: dict[tuple[int, str], LinearLoRA] = field(default_factory=dict)

    @property
    def modules(self) -> list[str]:
        return sorted({name for _, name in self.weights})


def read_config(path: str) -> dict:
    """The adapter's PEFT config, checked for what we implement."""
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config_path) or not os.path.isfile(os.path.join(path, WEIGHTS_FILE)):
        raise ValueError(f"LoRA adapter folder {path!r} needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    with open(config_path) as f:
        config = json.load(f)
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA adapter {path!r} is peft_type {config['peft_type']!r}; only LORA is supported")
    for key, default in _UNSUPPORTED.items():
        if config.get(key, default) not in (default, None, False, {}, []):
            raise ValueError(f"LoRA adapter {path!r} sets {key}={config[key]!r}, which is not supported")
    if config.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {path!r} sets bias={config['bias']!r}; only 'none' is supported")
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), (int, float)) or config[key] <= 0:
            raise ValueError(f"LoRA adapter {path!r}: {CONFIG_FILE} needs a positive {key!r}")
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"LoRA adapter {path!r} targets module(s) {unknown}, which this engine does not adapt; "
                         f"supported: {sorted(TARGETS)}")
    return config


def scaling_of(config: dict) -> float:
    """alpha / sqrt(r) for rsLoRA, else alpha / r."""
    r, alpha = config["r"], config["lora_alpha"]
    return alpha / math.sqrt(r) if config.get("use_rslora", False) else alpha / r


def load_adapter(request: LoRARequest, arch: ArchConfig, max_rank: int) -> LoRAAdapter:
    """The adapter at ``request.lora_path``, checked against ``arch`` (see the module doc), in float32."""
    path = request.lora_path
    config = read_config(path)
    rank = int(config["r"])
    if rank > max_rank:
        raise ValueError(f"LoRA adapter {request.lora_name!r} has rank {rank}, above max_lora_rank={max_rank}; "
                         "raise --max-lora-rank")
    pieces = linear_pieces(arch)
    tensors: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(os.path.join(path, WEIGHTS_FILE), framework="pt") as f:
        for key in f.keys():
            match = _KEY.match(key)
            if match is None:
                raise ValueError(f"LoRA adapter {request.lora_name!r}: tensor {key!r} is not a decoder linear's "
                                 f"lora_A/lora_B; supported modules: {sorted(TARGETS)}")
            layer, module, which = int(match[1]), match[2], match[3]
            if module not in TARGETS:
                raise ValueError(f"LoRA adapter {request.lora_name!r} adapts unknown module {module!r}; "
                                 f"supported: {sorted(TARGETS)}")
            if layer >= arch.num_hidden_layers:
                raise ValueError(f"LoRA adapter {request.lora_name!r} adapts layer {layer}, but the model has "
                                 f"{arch.num_hidden_layers} layers")
            tensors.setdefault((layer, module), {})[which] = f.get_tensor(key).float()
    if not tensors:
        raise ValueError(f"LoRA adapter {request.lora_name!r} holds no lora_A/lora_B tensors")
    adapter = LoRAAdapter(request, rank, scaling_of(config))
    merged: dict[tuple[int, str], list[tuple[int | None, torch.Tensor, torch.Tensor]]] = {}
    for (layer, module), ab in sorted(tensors.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {request.lora_name!r}: layer {layer} {module} has lora_{''.join(ab)} "
                             "without its pair")
        linear, piece = TARGETS[module]
        in_features, outs = pieces[linear]
        out = sum(outs) if piece is None else outs[piece]
        a, b = ab["A"], ab["B"]
        if a.shape != (rank, in_features) or b.shape != (out, rank):
            raise ValueError(f"LoRA adapter {request.lora_name!r}: layer {layer} {module} has lora_A "
                             f"{tuple(a.shape)} and lora_B {tuple(b.shape)}; this model needs {(rank, in_features)} "
                             f"and {(out, rank)} (an adapter for another base model?)")
        merged.setdefault((layer, linear), []).append((piece, a, b))
    for (layer, linear), parts in merged.items():
        adapter.weights[(layer, linear)] = _stack(parts, pieces[linear][1], adapter.scaling)
    return adapter


def _stack(parts: list[tuple[int | None, torch.Tensor, torch.Tensor]], outs: list[int],
           scaling: float) -> LinearLoRA:
    """One merged linear's A [sum r, in] and its pieces' scaled B, each placed at its output rows."""
    pieces, column = [], 0
    for piece, _, b in parts:
        pieces.append(BPiece(0 if piece is None else sum(outs[:piece]), column, (b * scaling).contiguous()))
        column += b.shape[1]
    return torch.cat([p[1] for p in parts]).contiguous(), tuple(pieces)
