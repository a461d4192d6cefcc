"""``folovllm quantize``: load a model in float32, quantize its decoder linears, write a GPTQ folder."""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from folovllm.model.layers.linear import LinearBase
    from folovllm.quantize.grid import QuantSpec

logger = logging.getLogger(__name__)

METHODS = ("gptq", "rtn")
CLIP_CHOICES = ("off", "mse", "hmse")  # grid.CLIP_MODES, without importing torch for --help


@dataclass(frozen=True)
class QuantizeArgs:
    """Everything one quantization run needs (the CLI's arguments, checked)."""

    out: str
    model: str | None = None  # None: the default model
    method: str = "gptq"
    bits: int = 4
    group_size: int = 128
    act_order: bool | None = None  # None: default_act_order(method)
    sym: bool = False
    damp: float = 0.01
    calib_file: str | None = None
    # 8k calibration tokens: about 12 minutes for the 135M default model on one busy CPU core
    num_samples: int = 32
    seq_len: int = 256
    seed: int = 0
    block_size: int = 128
    clip: str | None = None  # None: default_clip(method)

    def __post_init__(self) -> None:
        if self.clip is None:
            object.__setattr__(self, "clip", default_clip(self.method))
        if self.act_order is None:
            object.__setattr__(self, "act_order", default_act_order(self.method))
        if self.clip not in CLIP_CHOICES:
            raise ValueError(f"unknown --clip {self.clip!r}; choose one of {CLIP_CHOICES}")
        if self.method not in METHODS:
            raise ValueError(f"unknown quantization method {self.method!r}; choose one of {METHODS}")
        if self.method == "rtn" and self.act_order:
            raise ValueError("--act-order orders GPTQ's columns; round-to-nearest has no order (drop it)")
        if self.method == "rtn" and self.clip == "hmse":
            raise ValueError("--clip hmse weighs errors by calibration inputs, which round-to-nearest has none "
                             "of; use --clip mse or off")
        if self.num_samples <= 0 or self.seq_len <= 0:
            raise ValueError(f"--num-samples and --seq-len must be positive, got {self.num_samples} and {self.seq_len}")
        if os.path.isdir(self.out) and os.listdir(self.out):
            raise ValueError(f"--out {self.out!r} is not empty; pick a new folder")
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise ValueError(f"--out {self.out!r} is a file, not a folder")


def add_quantize_args(parser: argparse.ArgumentParser) -> None:
    """The ``folovllm quantize`` options."""
    parser.add_argument("--model", default=None, help="a .gguf file or HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--out", required=True, help="the folder to write (new or empty)")
    parser.add_argument("--method", default="gptq", help=f"one of {METHODS}")
    parser.add_argument("--bits", type=int, default=4, help="4 or 8")
    parser.add_argument("--group-size", type=int, default=128, help="input channels per scale; -1: one per row")
    parser.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=None,
                        help="GPTQ: quantize columns by descending activation energy (desc_act); "
                             "default: on for gptq, off for rtn")
    parser.add_argument("--sym", action=argparse.BooleanOptionalAction, default=False,
                        help="symmetric grid (zero point in the middle); default --no-sym: each group's own "
                             "min/max grid with a zero point")
    parser.add_argument("--damp", type=float, default=0.01,
                        help="GPTQ: Hessian damping, a fraction of its mean diagonal")
    parser.add_argument("--calib-file", default=None,
                        help="calibration text file (default: part of Python's documentation topics)")
    parser.add_argument("--num-samples", type=int, default=32, help="GPTQ: calibration windows")
    parser.add_argument("--seq-len", type=int, default=256, help="GPTQ: tokens per calibration window")
    parser.add_argument("--seed", type=int, default=0, help="picks the calibration windows")
    parser.add_argument("--block-size", type=int, default=128,
                        help="GPTQ: columns per lazy update batch (1 = update after every column)")
    parser.add_argument("--clip", choices=CLIP_CHOICES, default=None,
                        help="each group's range: off (min/max), mse (shrunk range of least |error|^2.4), "
                             "hmse (least error weighted by each input's cost, GPTQ only); "
                             "default: hmse for gptq, off for rtn")


def run_quantize(args: argparse.Namespace) -> None:
    """The CLI entry: check the arguments, quantize, write the folder, print a summary."""
    options = QuantizeArgs(
        out=args.out, model=args.model, method=args.method, bits=args.bits, group_size=args.group_size,
        act_order=args.act_order, sym=args.sym, damp=args.damp, calib_file=args.calib_file,
        num_samples=args.num_samples, seq_len=args.seq_len, seed=args.seed, block_size=args.block_size,
        clip=args.clip,
    )
    start = time.perf_counter()
    count = quantize(options)
    print(f"wrote {options.out}: {count} linears, {options.method} {options.bits}-bit "
          f"g{options.group_size}{' act-order' if options.act_order else ''} clip {options.clip} "
          f"in {time.perf_counter() - start:.1f} s")


def default_act_order(method: str) -> bool:
    """``--act-order`` when not given: on for GPTQ (measured better at 4 bits), off for RTN (no order)."""
    return method == "gptq"


def default_clip(method: str) -> str:
    """``--clip`` when not given: the best measured setting for ``method``."""
    return "hmse" if method == "gptq" else "off"


def quantize(options: QuantizeArgs) -> int:
    """Quantize ``options.model`` into ``options.out``; returns how many checkpoint linears it wrote."""
    import torch

    from folovllm.model.llama import LlamaForCausalLM
    from folovllm.model.loader import default_model_path, load_arch_config, load_model
    from folovllm.model.loader.tokenizer import load_tokenizer
    from folovllm.model.registry import get_model_class
    from folovllm.quantize.calibration import calibration_samples, calibration_text
    from folovllm.quantize.folder import checkpoint_tensors, hf_config_from_arch, write_folder
    from folovllm.quantize.gptq import GPTQConfig
    from folovllm.quantize.grid import QuantSpec
    from folovllm.quantize.sequential import decoder_linears, quantize_gptq, quantize_rtn

    spec = QuantSpec(options.bits, options.group_size, options.sym, options.clip)
    gptq = GPTQConfig(spec, options.damp, options.act_order, options.block_size)
    source = options.model or default_model_path()
    arch = load_arch_config(source)
    if not issubclass(get_model_class(arch.architecture), LlamaForCausalLM):
        # calibration runs Llama-family decoder layers one by one, and GGUF sources are rewritten as Llama configs
        raise ValueError(f"folovllm quantize supports Llama-family models (Llama, Qwen2, Qwen3); {source!r} is "
                         f"{arch.architecture}: serve it unquantized or with --quantization int8")
    if arch.quantization != "unquantized":
        raise ValueError(f"{source!r} is already quantized ({arch.quantization}); start from unquantized weights")
    if options.method == "gptq" and options.seq_len > arch.max_position_embeddings:
        raise ValueError(f"--seq-len {options.seq_len} exceeds the model's {arch.max_position_embeddings} positions")
    model = load_model(source, dtype=torch.float32, device="cpu")
    _check_shapes(decoder_linears(model), spec)
    tokenizer = load_tokenizer(source)

    with torch.no_grad():
        if options.method == "rtn":
            quantized = quantize_rtn(model, spec)
        else:
            samples = calibration_samples(tokenizer, calibration_text(options.calib_file), options.num_samples,
                                          options.seq_len, arch.vocab_size, options.seed)
            logger.info("calibrating on %d x %d tokens", *samples.shape)
            quantized = quantize_gptq(model, samples, gptq)
        tensors = checkpoint_tensors(model, quantized, options.bits)

    config = _source_config(source) if not source.endswith(".gguf") else hf_config_from_arch(arch, tokenizer)
    config["quantization_config"] = quantization_config(options)
    write_folder(options.out, tensors, config, source, tokenizer)
    return sum(1 for name in tensors if name.endswith(".qweight"))


def quantization_config(options: QuantizeArgs) -> dict[str, Any]:
    """config.json's ``quantization_config`` in the GPTQ tools' vocabulary."""
    calibration = {"num_samples": options.num_samples, "seq_len": options.seq_len} if options.method == "gptq" else {}
    return {
        "quant_method": "gptq",
        "bits": options.bits,
        "group_size": options.group_size,
        "desc_act": options.act_order,
        "sym": options.sym,
        "checkpoint_format": "gptq",
        "damp_percent": options.damp,
        "true_sequential": True,
        "static_groups": False,
        "lm_head": False,
        "meta": {"quantizer": "folovllm", "method": options.method, "clip": options.clip, **calibration},
    }


def _source_config(source: str) -> dict[str, Any]:
    path = os.path.join(source, "config.json") if os.path.isdir(source) else source
    with open(path) as f:
        return json.load(f)


def _check_shapes(linears: list[tuple[str, LinearBase]], spec: QuantSpec) -> None:
    """Every linear's sizes fit the grid and the int32 packing, before any slow work starts."""
    per_int = 32 // spec.bits
    for name, module in linears:
        outputs = getattr(module, "output_sizes", [module.output_size])  # each checkpoint piece packs alone
        if module.input_size % per_int or any(size % per_int for size in outputs):
            raise ValueError(f"{name} has {module.input_size} inputs and outputs {outputs}: {spec.bits}-bit "
                             f"packing needs each to be a multiple of {per_int}")
