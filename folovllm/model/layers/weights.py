"""Checkpoint tensors -> parameters: each tensor goes through its parameter's own ``weight_loader``.

The walk is the same for every model and format (GGUF dequantized, safetensors, a state dict): the
model class names its merged parameters (``stacked_params``), each layer knows its slice.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from folovllm.model.layers.linear import LinearBase, ShardId

if TYPE_CHECKING:
    from folovllm.model.layers.causal_lm import CausalLM


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a whole tensor (cast to the parameter's dtype); ValueError on a shape mismatch."""
    if param.shape != loaded.shape:
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}")
    param.data.copy_(loaded)


def checkpoint_target(model: CausalLM, name: str) -> tuple[str, ShardId | None]:
    """Our parameter name and shard id for a checkpoint tensor name (q_proj -> qkv_proj, "q")."""
    for piece, (stacked, shard_id) in model.stacked_params.items():
        if f".{piece}." in name:
            return name.replace(f".{piece}.", f".{stacked}."), shard_id
    return name, None


def load_checkpoint(model: CausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load HF-named tensors into ``model``; ValueError naming the first unknown, mis-shaped or missing one."""
    params = dict(model.named_parameters())
    loaded: set[tuple[str, ShardId | None]] = set()
    with torch.no_grad():
        for name, tensor in weights:
            if model.skips_checkpoint_tensor(name):
                continue
            target, shard_id = checkpoint_target(model, name)
            if target not in params and f"model.{target}" in params:
                target = f"model.{target}"  # the decoder saved alone (a sentence-transformers folder's)
            if target not in params and _is_zero_bias(name, tensor):
                continue  # some quantized-checkpoint exporters store zero biases for bias-free layers
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {type(model).__name__}")
            param = params[target]
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                if shard_id is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard_id)
            except ValueError as e:
                raise ValueError(f"checkpoint tensor {name!r} {e}") from e
            loaded.add((target, shard_id))
    expected = {(name, shard) for name, param in params.items() for shard in getattr(param, "shard_ids", (None,))
                if not getattr(param, "optional_in_checkpoint", False)}
    missing = sorted(expected - loaded, key=str)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")


def _is_zero_bias(name: str, tensor: torch.Tensor) -> bool:
    return name.endswith(".bias") and not bool(tensor.any())


def process_weights_after_loading(model: nn.Module) -> None:
    """Let each linear layer's method repack or quantize its loaded weights (once, after loading)."""
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.method.process_weights_after_loading(module)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer, counting a tensor shared by two modules (tied weights) once."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())
