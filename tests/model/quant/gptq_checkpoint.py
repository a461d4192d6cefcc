"""Test checkpoints in GPTQ's layout: round-to-nearest codes packed as GPTQ exporters store them."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from folovllm.model.quantization.pack import pack_int32

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Linears fed the same input share one act-order permutation (the same Hessian gives the same order).
_SHARED_INPUT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}


def act_order_g_idx(in_features: int, group_size: int, gen: torch.Generator) -> torch.Tensor:
    """A desc_act g_idx: rows taken in a random order, each run of ``group_size`` of them one group."""
    order = torch.randperm(in_features, generator=gen)
    g_idx = torch.empty(in_features, dtype=torch.int32)
    g_idx[order] = (torch.arange(in_features) // (in_features if group_size == -1 else group_size)).to(torch.int32)
    return g_idx


def rtn_gptq(weight: torch.Tensor, bits: int, group_size: int, sym: bool, zero_offset: int = 1,
             g_idx: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Round-to-nearest GPTQ tensors of a [out, in] weight, and the fp32 weight [out, in] they stand for.

    zero_offset 1 writes the v1 format (zero points stored minus one); v1 cannot store a zero of 0,
    so asymmetric zeros are kept >= 1 then.
    """
    out_features, in_features = weight.shape
    size = in_features if group_size == -1 else group_size
    if g_idx is None:
        g_idx = (torch.arange(in_features) // size).to(torch.int32)
    groups = 1 if group_size == -1 else math.ceil(in_features / group_size)
    maxq = 2**bits - 1
    w = weight.float().t()  # [in, out]
    scales = torch.empty(groups, out_features)
    zeros = torch.empty(groups, out_features, dtype=torch.int64)
    for g in range(groups):
        rows = w[g_idx.long() == g]
        lo, hi = rows.min(0).values.clamp(max=0), rows.max(0).values.clamp(min=0)
        if sym:
            scale = torch.maximum(hi, -lo) * 2 / maxq
            zero = torch.full((out_features,), (maxq + 1) // 2, dtype=torch.int64)
        else:
            scale = (hi - lo) / maxq
            zero = torch.round(-lo / scale.clamp(min=1e-8)).to(torch.int64).clamp(zero_offset, maxq)
        scales[g], zeros[g] = scale.clamp(min=1e-8), zero
    scales = scales.half().float()  # checkpoints store fp16 scales
    s, z = scales[g_idx.long()], zeros[g_idx.long()]
    codes = torch.clamp(torch.round(w / s) + z, 0, maxq).to(torch.int32)
    dequantized = ((codes - z) * s).t().contiguous()
    tensors = {
        "qweight": pack_int32(codes, bits, dim=0),
        "qzeros": pack_int32((zeros - zero_offset).to(torch.int32), bits, dim=1),
        "scales": scales.half(),
        "g_idx": g_idx.clone(),
    }
    return tensors, dequantized


def gptq_state_dict(state: dict[str, torch.Tensor], bits: int, group_size: int, sym: bool, desc_act: bool,
                    zero_offset: int, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(GPTQ checkpoint tensors, the same model with dequantized float weights) of a HF Llama state dict."""
    gen = torch.Generator().manual_seed(seed)
    gptq: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    perms: dict[tuple[str, str], torch.Tensor] = {}
    for name, tensor in state.items():
        module, _, leaf = name.rpartition(".")
        proj = module.rpartition(".")[2]
        if proj not in LINEAR_NAMES or leaf != "weight":
            gptq[name], dense[name] = tensor.contiguous(), tensor.contiguous()
            continue
        g_idx = None
        if desc_act:
            key = (module.rpartition(".")[0], _SHARED_INPUT.get(proj, proj))
            if key not in perms:
                perms[key] = act_order_g_idx(tensor.shape[1], group_size, gen)
            g_idx = perms[key]
        tensors, dequantized = rtn_gptq(tensor, bits, group_size, sym, zero_offset, g_idx)
        for leaf_name, t in tensors.items():
            gptq[f"{module}.{leaf_name}"] = t
        dense[name] = dequantized
    return gptq, dense


def write_folder(path: Path, config: dict, tensors: dict[str, torch.Tensor], extra_files: dict[str, str]) -> str:
    """A model folder: model.safetensors, config.json, and other small files (tokenizer)."""
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    for name, text in extra_files.items():
        (path / name).write_text(text)
    return str(path)
