"""The CPU platform's compile step: kernel forms, then the decoder layers as direct calls or a C++ chain."""
from __future__ import annotations

import logging

import torch
from torch import nn

from folovllm.attention.metadata import AttentionMetadata
from folovllm.compilation.direct import DirectDecoderLayer, direct_layer, hook_tables
from folovllm.compilation.layer_chain import LayerChain, layer_chain
from folovllm.compilation.kernel_forms import use_kernel_forms
from folovllm.model.layers import DecoderLayers, KVCache, Rope
from folovllm.model.layers.linear import LinearBase
from folovllm.platforms.cpu import CpuPlatform

DECODER_FORMS = ("modules", "direct", "chain", "team")
logger = logging.getLogger(__name__)


class CompiledDecoder:
    """A ``DecoderLayers``' compiled form: its layers' direct calls, a decode step through the chain where
    one was built; None (the modules run the step) while a hook is registered on any of its modules."""

    def __init__(self, layers: DecoderLayers, direct: list[DirectDecoderLayer], chain: LayerChain | None) -> None:
        self.direct, self.chain = direct, chain
        self.hook_tables = hook_tables(layers.modules())

    def __call__(self, rope: Rope, x: torch.Tensor, kv_caches: list[KVCache],
                 meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not x.is_contiguous() or any(self.hook_tables):
            return None
        if self.chain is not None and self.chain.runs(meta):
            return self.chain(rope, x, kv_caches, meta)
        residual = None
        for layer, kv_cache in zip(self.direct, kv_caches, strict=True):
            x, residual = layer(rope, x, residual, kv_cache, meta)
        return x, residual


def compile_cpu_model(model: nn.Module, platform: CpuPlatform) -> None:
    """Kernel forms where the platform's fused ops run (``FOLOVLLM_CPU_FUSED_OPS``); then, as far as
    ``FOLOVLLM_CPU_DECODER`` allows, each stack of pre-norm layers as direct calls and a chain (both call the
    C++ library's ops, so only over its op table)."""
    ops = platform.kernel_ops()
    use_kernel_forms(model, ops)
    form = platform.decoder_form if ops is not None and ops.source == "folovllm" else "modules"
    if form in ("chain", "team") and any(isinstance(m, LinearBase) and not m.method.fusable for m in model.modules()):
        logger.info("LoRA adapters are on: the decoder layers run as direct calls (the C++ layer chain and the "
                    "fused int4 MLP do not add the adapters' deltas)")
        form = "direct"
    for stack in model.modules():
        if not isinstance(stack, DecoderLayers):
            continue
        stack.compiled = None
        direct = [direct_layer(layer) for layer in stack] if form != "modules" else []
        if not direct or any(d is None for d in direct):
            continue
        chain = layer_chain(direct, team=form == "team") if form in ("chain", "team") else None
        stack.compiled = CompiledDecoder(stack, direct, chain)
