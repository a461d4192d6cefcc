"""A step's decoder layers in one C++ call, where the CPU attention kernel alone takes the step's attention.

``DirectDecoderLayer`` (``direct.py``) already skips the module calls, but each of its ~9 op calls per
layer still costs a few microseconds of Python and op dispatch: at batch 1 that is about a fifth of a
decode step, paid by bf16 and quantized models alike. The ``folovllm.DecoderChain`` class
(csrc/cpu/decoder_chain.cpp) holds each layer's ops and fixed arguments and calls them in the same order
with the same arguments: the same bits as the direct layers.

A chain is built only when every layer's linears are tagged single op calls (``quantization/op_call.py``:
plain F.linear, our bf16, int4, int8 and GGUF kernels, the fused int4 MLP; not oneDNN's, whose empty scalar list
cannot cross into C++) and the layers share one CPU
attention backend; it runs only steps whose attention is the kernel op alone (decode-only steps; a prefill
chunk goes through the direct layers). ``FOLOVLLM_CPU_DECODER=direct`` never builds one.

Where every linear is an int4 matmul with bf16 activations (act-order ones too), a GGUF matmul or our bf16
linear, a step of a few rows whose attention is short runs on one team of threads that stays together for the whole step
(csrc/cpu/decoder_team.h): the matmuls split by columns, the ops between them on the first thread while the
others prefetch their columns of the next matmul; the same bits. ``FOLOVLLM_CPU_DECODER=chain`` keeps those
steps on the ops.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from folovllm.attention.cpu_backend import CpuAttentionBackend
from folovllm.attention.metadata import AttentionMetadata
from folovllm.compilation.direct import DirectDecoderLayer
from folovllm.model.layers import KVCache, Rope
from folovllm.model.quantization.op_call import op_call_of

# The team runs a step's attention on one thread: it takes steps whose attention (query rows x keys,
# summed over sequences and kv heads) costs less than this. One stream of the default model (3 kv heads),
# GPTQ 4-bit, two threads: the team's step 1.10x as fast as the ops' at a 512-token context, 0.89x at 800.
TEAM_ATTENTION_COST = 3 * 512


class LayerChain:
    """The decoder layers of a model as one ``DecoderChain.run`` call (see the module doc)."""

    def __init__(self, chain: Any, backend: CpuAttentionBackend) -> None:
        self.chain, self._run, self.backend = chain, chain.run, backend

    def runs(self, meta: AttentionMetadata) -> bool:
        """Whether this step can go through the chain (its attention is the kernel op alone)."""
        return self.backend.kernel_takes_whole_step(meta)

    def on_team(self, rows: int, meta: AttentionMetadata) -> bool:
        """Whether the chain runs a step of ``rows`` rows with this metadata on its team of threads."""
        _, seq_lens, starts = self.backend.kernel_metadata(meta)
        return self.chain.team_takes(rows, seq_lens, starts)

    def __call__(self, rope: Rope, x: torch.Tensor, kv_caches: Sequence[KVCache],
                 meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) after every layer, from the embeddings ``x``: what the direct layers' loop returns."""
        caches = [cache for kv in kv_caches for cache in kv]
        return self._run(x, rope[0], rope[1], caches, meta.slot_mapping, *self.backend.kernel_metadata(meta))


def _layer_calls(layer: DirectDecoderLayer) -> dict[str, list[tuple[Any, tuple]]] | None:
    """Each part's op calls ``op(x, *args)``, in order; None where a linear is not one tagged op call."""
    mlp = [layer.mlp] if layer.mlp is not None else [layer.gate_up, None, layer.down]
    calls: dict[str, list[tuple[Any, tuple] | None]] = {
        "qkv": [op_call_of(layer.qkv)], "o_proj": [op_call_of(layer.o_proj)],
        "mlp": [(layer.silu_and_mul, ()) if fn is None else op_call_of(fn) for fn in mlp]}
    if any(call is None for part in calls.values() for call in part):
        return None
    return calls  # type: ignore[return-value]


def layer_chain(layers: Sequence[DirectDecoderLayer], team: bool) -> LayerChain | None:
    """The chain for these direct layers (``team``: small decode steps on one team of threads), or None for
    a layer it does not take (a linear that is not one tagged op call, another attention backend, backends
    not shared)."""
    if not layers:
        return None
    backend = layers[0].backend
    if type(backend) is not CpuAttentionBackend or any(layer.backend is not backend for layer in layers):
        return None
    calls = [_layer_calls(layer) for layer in layers]
    if any(c is None for c in calls):
        return None
    chain = torch.classes.folovllm.DecoderChain(backend.sdpa_from, TEAM_ATTENTION_COST if team else 0)
    for layer, parts in zip(layers, calls):
        chain.add_layer(layer.norm1, layer.eps1, layer.norm2, layer.eps2, layer.num_heads, layer.num_kv_heads,
                        layer.q_norm, layer.k_norm, layer.qk_eps, layer.scale, layer.sliding_window or 0)
        for part, part_calls in parts.items():
            for op, args in part_calls:
                chain.add_call(part, op._schema.name, op._schema.overload_name, list(args))
    return LayerChain(chain, backend)
