"""PEFT-format LoRA adapters written with safetensors (no peft needed), the merged transformers reference, and
one linear's LoRA method in its torch and kernel forms over the same random slots."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from folovllm.lora.adapter import BPiece
from folovllm.lora.layers import LoRABatch, LoRALinearMethod, LoRAOp
from folovllm.model.quantization.linear_method import UnquantizedLinearMethod

ATTN, MLP = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")


def module_shapes(config) -> dict[str, tuple[int, int]]:
    """(in, out) of each adaptable linear of an HF Llama config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    h, i = config.hidden_size, config.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def write_adapter(folder: Path, config, rank: int, targets: tuple[str, ...], seed: int, alpha: float = 16,
                  rslora: bool = False, std: float = 0.3, extra_config: dict | None = None,
                  shapes: dict[str, tuple[int, int]] | None = None) -> Path:
    """A random adapter (B non-zero, so the outputs change) in PEFT's files; returns its folder."""
    gen = torch.Generator().manual_seed(seed)
    shapes = shapes or module_shapes(config)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for module in targets:
            in_f, out_f = shapes[module]
            part = "self_attn" if module in ATTN else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * std
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config_json = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets),
                   "use_rslora": rslora, "base_model_name_or_path": "tiny", "bias": "none",
                   **(extra_config or {})}
    (folder / "adapter_config.json").write_text(json.dumps(config_json))
    return folder


def merged_model(model_dir: str, adapter: Path | None):
    """The HF model in fp32 with ``W + scale·B·A`` merged into each targeted linear (None: the base)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    if adapter is None:
        return model
    config = json.loads((adapter / "adapter_config.json").read_text())
    r, alpha = config["r"], config["lora_alpha"]
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, a in tensors.items():
            if ".lora_A." not in key:
                continue
            b = tensors[key.replace("lora_A", "lora_B")]
            name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            params[name] += scale * (b @ a)
    return model


def hf_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                             min_new_tokens=max_tokens, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def cpu_lora_add(*args: torch.Tensor) -> None:
    """The C++ library's op, looked up when called (a test that runs it skips where the library is missing)."""
    torch.ops.folovllm.lora_add(*args)


def adapted_forms(gen: torch.Generator, row_slots: list[int], in_features: int, outs: list[int], specs: list,
                  kernel: LoRAOp = cpu_lora_add):
    """The torch form and the kernel form (``kernel``: the C++ op by default) over the same slots; spec (rank,
    pieces) per slot, None: no weights."""
    batch = LoRABatch.from_row_slots(row_slots)
    forms = [LoRALinearMethod(UnquantizedLinearMethod(), len(specs), batch, op) for op in (None, kernel)]
    for slot, spec in enumerate(specs):
        weights = None
        if spec is not None:
            rank, pieces = spec
            a = torch.randn(rank * len(pieces), in_features, generator=gen) * 0.1
            weights = (a, tuple(BPiece(sum(outs[:p]), j * rank, torch.randn(outs[p], rank, generator=gen) * 0.1)
                                for j, p in enumerate(pieces)))
        for method in forms:
            method.set_slot(slot, weights)
    return forms
