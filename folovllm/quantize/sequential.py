"""Quantize a loaded model's decoder linears one layer at a time, in the order the forward runs.

Calibration tokens go through the model in float32. Each linear's Hessian comes from its inputs as
produced by everything before it already quantized: the earlier layers and, within a layer, the
linears that run before it (q/k/v share one input and are one merged linear here; so are gate/up).
A stage's forward stops at the linear it measures, so the extra passes cost little.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from folovllm.attention.metadata import AttentionMetadata
from folovllm.model.layers import CausalLM
from folovllm.model.layers.linear import LinearBase
from folovllm.quantize.gptq import GPTQConfig, gptq_quantize
from folovllm.quantize.grid import QuantizedWeight, QuantSpec, rtn_quantize

logger = logging.getLogger(__name__)

TOKENS_PER_FORWARD = 4096  # bounds activation memory; whole samples per forward
_BLOCK = 16  # KV cache block size of the calibration forward (any value gives the same result)


class _StopForward(Exception):
    """Raised by a hook once the measured linear has seen its input: the rest of the layer is not needed."""


@dataclass
class _Batch:
    """The fixed pieces of a forward over ``num_seqs`` samples of ``seq_len`` tokens."""

    rope: tuple[torch.Tensor, torch.Tensor]
    kv_cache: tuple[torch.Tensor, torch.Tensor]
    meta: AttentionMetadata


def decoder_linears(model: CausalLM) -> list[tuple[str, LinearBase]]:
    """(name, module) of every linear inside the decoder layers, in forward order (the LM head is left out)."""
    return [(name, module) for name, module in model.model.layers.named_modules(prefix="model.layers")
            if isinstance(module, LinearBase)]


@torch.no_grad()
def quantize_rtn(model: CausalLM, spec: QuantSpec) -> dict[str, QuantizedWeight]:
    """Round every decoder linear to its grid (no calibration); the model keeps the rounded weights."""
    results = {}
    for name, module in tqdm(decoder_linears(model), desc="rtn", unit="linear"):
        results[name] = rtn_quantize(module.weight, spec)
        module.weight.copy_(results[name].dequantize())
    return results


@torch.no_grad()
def quantize_gptq(model: CausalLM, samples: torch.Tensor, config: GPTQConfig) -> dict[str, QuantizedWeight]:
    """GPTQ every decoder linear of ``model`` (float32, unquantized) on ``samples`` [N, L] token ids.

    The model's linear weights are replaced by their dequantized values as it goes; returns the
    quantized weight of each linear by module name.
    """
    seq_len = samples.shape[1]
    batches: dict[int, _Batch] = {}
    hidden = model.model.embed_tokens(samples)
    residual = torch.zeros_like(hidden)  # the fused add-norm of layer 0 then sees the embeddings alone
    results: dict[str, QuantizedWeight] = {}
    bar = tqdm(list(enumerate(model.model.layers)), desc="gptq", unit="layer")
    for index, layer in bar:
        run = _LayerRun(layer, model, hidden, residual, max(1, TOKENS_PER_FORWARD // seq_len), batches)
        losses = []
        for name, module in layer.named_modules(prefix=f"model.layers.{index}"):
            if not isinstance(module, LinearBase):
                continue
            bar.set_postfix_str(name.rpartition(".")[2])
            results[name], loss = gptq_quantize(module.weight, run.hessian(module), config)
            module.weight.copy_(results[name].dequantize())
            losses.append(f"{name.rpartition('.')[2]} {loss:.3g}")
        logger.debug("layer %d GPTQ error: %s", index, ", ".join(losses))
        hidden, residual = run.outputs()
    return results


@dataclass
class _LayerRun:
    """One decoder layer over every calibration sample, a few samples per forward."""

    layer: nn.Module
    model: CausalLM
    hidden: torch.Tensor  # [N, L, H] the layer's inputs
    residual: torch.Tensor
    per_forward: int
    batches: dict[int, _Batch]

    def hessian(self, module: LinearBase) -> torch.Tensor:
        """2 X^T X / tokens of ``module``'s inputs; each forward stops once ``module`` has its input."""
        total = torch.zeros(module.input_size, module.input_size)
        tokens = 0

        def accumulate(_module: nn.Module, args: tuple) -> None:
            nonlocal tokens
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            total.addmm_(x.T, x)
            tokens += x.shape[0]
            raise _StopForward

        handle = module.register_forward_pre_hook(accumulate)
        try:
            for start in range(0, self.hidden.shape[0], self.per_forward):
                try:
                    self._forward(start)
                except _StopForward:
                    pass
        finally:
            handle.remove()
        if tokens == 0:
            raise ValueError(f"{type(module).__name__} never ran in its layer's forward; cannot calibrate it")
        return total * (2 / tokens)

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's (hidden, residual) outputs [N, L, H]: the next layer's inputs."""
        chunks = [self._forward(start) for start in range(0, self.hidden.shape[0], self.per_forward)]
        return torch.cat([h for h, _ in chunks]), torch.cat([r for _, r in chunks])

    def _forward(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.hidden[start:start + self.per_forward]
        r = self.residual[start:start + self.per_forward]
        num_seqs, seq_len, width = x.shape
        if num_seqs not in self.batches:
            self.batches[num_seqs] = _make_batch(self.model, num_seqs, seq_len)
        batch = self.batches[num_seqs]
        out, res = self.layer(batch.rope, x.reshape(-1, width), r.reshape(-1, width), batch.kv_cache, batch.meta)
        return out.view(num_seqs, seq_len, width), res.view(num_seqs, seq_len, width)


def _make_batch(model: CausalLM, num_seqs: int, seq_len: int) -> _Batch:
    """Rotary tables, a KV cache and attention metadata for ``num_seqs`` prompts of ``seq_len`` tokens."""
    arch = model.arch
    blocks_per_seq = -(-seq_len // _BLOCK)
    positions = torch.arange(seq_len).repeat(num_seqs)
    tables = torch.arange(num_seqs * blocks_per_seq).view(num_seqs, blocks_per_seq)
    slots = (tables[:, :, None] * _BLOCK + torch.arange(_BLOCK)).view(num_seqs, -1)[:, :seq_len].reshape(-1)
    shape = (num_seqs * blocks_per_seq, _BLOCK, arch.num_key_value_heads, arch.head_dim)
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=torch.arange(num_seqs + 1) * seq_len,
        seq_lens=torch.full((num_seqs,), seq_len),
        block_tables=tables,
        query_lens=[seq_len] * num_seqs,
        seq_lens_list=[seq_len] * num_seqs,
        block_size=_BLOCK,
    )
    return _Batch(model.model.rotary_emb(positions, torch.float32), (torch.zeros(shape), torch.zeros(shape)), meta)
