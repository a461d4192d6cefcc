"""Models of published shapes with random weights, in the forms every engine of the comparison loads.

    .venv/bin/python benchmarks/vs_vllm/shapes.py qwen3-1.7b      # HF folder, then Q4_K_M and Q8_0 GGUFs
    .venv/bin/python benchmarks/vs_vllm/shapes.py tiny --types Q4_K_M

For a shape (``SHAPES``: the published config.json of the model the name says, or ``tiny`` / ``tiny-qwen3``
to try the plumbing): the HF folder, built with transformers' own class for the config (on the meta device, so an 8B
model never sits whole in memory) and filled tensor by tensor with seeded random weights (normal, std
0.02; norms 1), sharded safetensors, with the default model's tokenizer (SmolLM2's 49152 tokens; the
converter pads the vocabulary to the shape's with unused entries). Then llama.cpp's own tools, from the
tree ``make llama-cpp`` builds: ``convert_hf_to_gguf.py`` to a bf16 GGUF and ``llama-quantize`` to each of
``--types``, so vLLM (the folder), llama.cpp and FoloVLLM (the folder, and each GGUF) run the same bits.
Each step is skipped when its output exists (``--force`` redoes them).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench_out" / "vs_vllm" / "shapes"
QUANT_TYPES = ("Q4_K_M", "Q8_0")
SHARD_BYTES = 2 * 2**30  # safetensors shards of at most this many bytes: writing one holds it in memory

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
SHAPES: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-1.7B
    "qwen3-1.7b": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048,
                   "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
                   "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
                   "hidden_act": "silu", "attention_bias": False},
    # meta-llama/Llama-3.2-3B
    "llama-3.2-3b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
                     "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
                     "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": True,
                     "rope_theta": 500000.0, "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0},
                     "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "hidden_act": "silu"},
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False,
                     "rope_theta": 500000.0, "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0},
                     "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "hidden_act": "silu"},
    # the plumbing's checks: K-quant rows (multiples of 256) at a size that converts in seconds; a Llama, and a
    # Qwen3 with the published vocabulary (the converter pads the tokenizer's to it)
    "tiny-qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
                   "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 64, "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1000000.0,
                   "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "hidden_act": "silu", "attention_bias": False},
    "tiny": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
             "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True, "rope_theta": 10000.0,
             "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "hidden_act": "silu"},
}


def shape_config(name: str) -> dict[str, Any]:
    """The config.json of shape ``name``; ValueError naming the known ones."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    return dict(SHAPES[name])


def paths(name: str, out: Path = DEFAULT_OUT) -> dict[str, Path]:
    """Where a shape's forms live: its HF folder, its bf16 GGUF, and one GGUF per quantization type."""
    base = out / name
    return {"hf": base / "hf", "bf16": base / f"{name}-bf16.gguf",
            **{t: base / f"{name}-{t}.gguf" for t in QUANT_TYPES}}


def _bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def make_hf_folder(name: str, folder: Path, seed: int = 0) -> None:
    """The shape's HF folder: config, random bf16 weights written shard by shard, the default model's tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from folovllm.model.loader import default_model_path

    config = shape_config(name)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    names = [n for n in skeleton.state_dict() if not (hf_config.tie_word_embeddings and n == "lm_head.weight")]
    folder.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(folder)
    gen = torch.Generator().manual_seed(seed)
    shard, size, index, count = {}, 0, {}, 0

    def flush() -> None:
        nonlocal shard, size, count
        if shard:
            count += 1
            file = f"model-{count:05d}.safetensors"
            save_file(shard, str(folder / file), metadata={"format": "pt"})
            index.update({n: file for n in shard})
            shard, size = {}, 0

    state = skeleton.state_dict()
    for tensor_name in names:
        shape = state[tensor_name].shape
        if tensor_name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        if size + _bytes(tensor) > SHARD_BYTES:
            flush()
        shard[tensor_name] = tensor
        size += _bytes(tensor)
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(_bytes(state[n]) for n in names)}, "weight_map": index}, indent=1))
    gguf = default_model_path()
    AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf)).save_pretrained(folder)


def convert(folder: Path, bf16: Path) -> None:
    """llama.cpp's converter: the HF folder to a bf16 GGUF."""
    script = llama_cpp.fetch() / "convert_hf_to_gguf.py"
    subprocess.run([sys.executable, str(script), str(folder), "--outtype", "bf16", "--outfile", str(bf16)], check=True)


def quantize(bf16: Path, out: Path, qtype: str, tier: str = "native") -> None:
    """llama.cpp's llama-quantize: the bf16 GGUF to ``qtype`` (Q4_K_M, Q8_0, ...)."""
    subprocess.run([str(llama_cpp.binary(tier, "llama-quantize")), str(bf16), str(out), qtype], check=True)


def build(name: str, types: tuple[str, ...] = QUANT_TYPES, out: Path = DEFAULT_OUT, force: bool = False,
          tier: str = "native") -> dict[str, Path]:
    """Every form of shape ``name`` (each made when missing or ``force``); their paths."""
    where = paths(name, out)
    if force or not (where["hf"] / "model.safetensors.index.json").exists():
        print(f"{name}: the HF folder", flush=True)
        make_hf_folder(name, where["hf"])
    if force or not all(where[t].exists() for t in types):
        if force or not where["bf16"].exists():
            print(f"{name}: the bf16 GGUF", flush=True)
            convert(where["hf"], where["bf16"])
        for t in types:
            if force or not where[t].exists():
                print(f"{name}: {t}", flush=True)
                quantize(where["bf16"], where[t], t, tier)
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shape", choices=list(SHAPES))
    parser.add_argument("--types", default=",".join(QUANT_TYPES), help="llama-quantize types to make")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="remake every form")
    parser.add_argument("--keep-bf16", action="store_true", help="keep the bf16 GGUF (deleted once quantized)")
    args = parser.parse_args()
    types = tuple(t for t in args.types.split(",") if t)
    unknown = [t for t in types if t not in QUANT_TYPES]
    if unknown:
        parser.error(f"--types takes {', '.join(QUANT_TYPES)}; got {unknown}")
    where = build(args.shape, types, args.out, args.force)
    if not args.keep_bf16:
        where["bf16"].unlink(missing_ok=True)
    for key, path in where.items():
        if path.exists():
            print(f"{key}: {path}")


if __name__ == "__main__":
    main()
