"""Quantized weights on the CPU: decode speed and weight bytes of the default model, bf16 vs GPTQ vs INT8.

    .venv/bin/python scripts/quant_bench.py --rounds 5 --out docs/results/quant-cpu.json

Writes a GPTQ checkpoint of the default model (its GGUF weights, dequantized, then round-to-nearest
4-bit, groups of 128, symmetric, v1 format; and 8-bit the same way), then times every variant in
alternating rounds in this one process: one stream (1 prompt, greedy) and a batch of 64 streams.
Reported: median decode tok/s per variant, the ratio to bf16, and weight MiB (all and linear layers).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from folovllm import LLM, SamplingParams  # noqa: E402
from folovllm.model.gguf_loader import gguf_arch_config, iter_gguf_weights, open_gguf  # noqa: E402
from folovllm.model.linear import LinearBase  # noqa: E402
from folovllm.model.loader import default_model_path  # noqa: E402
from folovllm.model.registry import get_model_class  # noqa: E402
from tests.model.quant.gptq_checkpoint import gptq_state_dict  # noqa: E402


def write_gptq_folder(folder: Path, bits: int, group_size: int) -> str:
    """The default model as a GPTQ checkpoint folder (RTN codes; the tokenizer falls back to the GGUF's)."""
    gguf_path = default_model_path()
    reader = open_gguf(gguf_path)
    arch = gguf_arch_config(reader, "SmolLM2-135M-Instruct")
    cls = get_model_class(arch.architecture)
    state = {name: t.float() for name, t in iter_gguf_weights(reader, arch, cls.gguf_qk_permuted)}
    gptq, _ = gptq_state_dict(state, bits, group_size, sym=True, desc_act=False, zero_offset=1)
    config = {
        "architectures": [arch.architecture], "vocab_size": arch.vocab_size, "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size, "num_hidden_layers": arch.num_hidden_layers,
        "num_attention_heads": arch.num_attention_heads, "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim, "rms_norm_eps": arch.rms_norm_eps, "rope_theta": arch.rope_theta,
        "max_position_embeddings": arch.max_position_embeddings, "tie_word_embeddings": arch.tie_word_embeddings,
        "eos_token_id": arch.eos_token_ids,
        "quantization_config": {"quant_method": "gptq", "bits": bits, "group_size": group_size,
                                "desc_act": False, "sym": True, "checkpoint_format": "gptq"},
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half() if v.is_floating_point() else v for k, v in gptq.items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def weight_mib(llm: LLM) -> tuple[float, float]:
    """(all weights, linear layers only) in MiB, as the model holds them."""
    model = llm.llm_engine.worker.model
    linear = {id(t): t for m in model.modules() if isinstance(m, LinearBase) and m is not model.lm_head
              for t in (*m.parameters(), *m.buffers())}
    return model.weight_bytes() / 2**20, sum(t.numel() * t.element_size() for t in linear.values()) / 2**20


def decode_tok_s(llm: LLM, streams: int, prompt_len: int, max_tokens: int) -> float:
    """Output tokens per second of ``streams`` greedy requests (short prompts: the time is mostly decode)."""
    prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 10 for j in range(prompt_len)]} for i in range(streams)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one-stream-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="quant-bench-"))
    variants = {
        "bf16": (default_model_path(), {}),
        "gptq-4bit-g128": (write_gptq_folder(tmp / "gptq4", 4, 128), {}),
        "gptq-8bit-g128": (write_gptq_folder(tmp / "gptq8", 8, 128), {}),
        "int8": (default_model_path(), {"quantization": "int8"}),
    }
    engine_args = dict(dtype="bfloat16", max_model_len=512, kv_cache_memory="512MiB", max_num_seqs=args.batch)
    llms = {name: LLM(path, **engine_args, **extra) for name, (path, extra) in variants.items()}
    for llm in llms.values():  # warm-up
        decode_tok_s(llm, 1, 8, 4)
    one: dict[str, list[float]] = {name: [] for name in llms}
    batch: dict[str, list[float]] = {name: [] for name in llms}
    for r in range(args.rounds):
        for name, llm in llms.items():  # alternating: each round times every variant once
            one[name].append(decode_tok_s(llm, 1, 4, args.one_stream_tokens))
            batch[name].append(decode_tok_s(llm, args.batch, 4, args.batch_tokens))
        print(f"round {r + 1}: " + ", ".join(f"{n} {one[n][-1]:.1f}/{batch[n][-1]:.0f}" for n in llms), flush=True)

    result = {"threads": torch.get_num_threads(), "load_average": list(os.getloadavg()), "rounds": args.rounds, "batch": args.batch,
              "one_stream_tokens": args.one_stream_tokens, "batch_tokens": args.batch_tokens, "variants": {}}
    base_one, base_batch = statistics.median(one["bf16"]), statistics.median(batch["bf16"])
    base_all, base_linear = weight_mib(llms["bf16"])
    for name, llm in llms.items():
        all_mib, linear_mib = weight_mib(llm)
        med_one, med_batch = statistics.median(one[name]), statistics.median(batch[name])
        result["variants"][name] = {
            "one_stream_tok_s": med_one, "one_stream_ratio": med_one / base_one,
            "one_stream_spread": [min(one[name]), max(one[name])],
            "batch_tok_s": med_batch, "batch_ratio": med_batch / base_batch,
            "batch_spread": [min(batch[name]), max(batch[name])],
            "weight_mib": all_mib, "weight_drop": 1 - all_mib / base_all,
            "linear_mib": linear_mib, "linear_drop": 1 - linear_mib / base_linear,
        }
        print(f"{name:16s} one stream {med_one:7.1f} tok/s ({med_one / base_one:4.2f}x)  "
              f"batch {args.batch} {med_batch:7.0f} tok/s ({med_batch / base_batch:4.2f}x)  "
              f"weights {all_mib:6.1f} MiB ({1 - all_mib / base_all:+.0%} drop), "
              f"linears {linear_mib:6.1f} MiB ({1 - linear_mib / base_linear:.0%} drop)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
