"""Read a llama.cpp GGUF file: ArchConfig from its metadata, weights under HF names: dequantized, or (with
load_quantized) kept in their file's types, packed for our kernel (``use_gguf_packed``: the linears, the LM
head and the embedding table), or as int4 parts for torch's int4 kernel (``use_gguf_int4``)."""
from __future__ import annotations

import logging
import mmap
import re
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import gguf
import numpy as np
import numpy.typing as npt
import torch

from folovllm import envs
from folovllm.model.arch import FULL, SLIDING, ArchConfig
from folovllm.model.layers.embedding import VocabEmbedding
from folovllm.model.layers.linear import LinearBase, MergedColumnParallelLinear
from folovllm.model.layers.weights import checkpoint_target
from folovllm.model.quantization.gguf_native import GGUFPackedLinearMethod, GGUFWeight, packable
from folovllm.model.quantization.gguf_int4 import (
    GGUF_INT4_TENSORS,
    GGUF_INT4_TYPES,
    GGUFInt4LinearMethod,
    gguf_int4_fits,
    gguf_int4_parts,
)
from folovllm.model.registry import architecture_for_gguf, get_model_class
from folovllm.platforms.interface import LinearKernels

if TYPE_CHECKING:
    from folovllm.model.layers.causal_lm import CausalLM

logger = logging.getLogger(__name__)

_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_ROPE_FREQS = "rope_freqs.weight"
# Linux's value (Python names it from 3.13); elsewhere none
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22 if sys.platform.startswith("linux") else None)
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


class _PlainViewReader(gguf.GGUFReader):
    """gguf's reader whose every read of the header is a view of a plain ndarray over its memmap: the reader
    slices once per vocabulary entry (about 700,000 times for a Llama 3 file), and a memmap's slice costs
    several times an ndarray's (4.3 s of an 8B file's load, 1.3 s so). The same fields and tensors; the
    tensors' data are plain views of the same mapping (``data`` stays the memmap)."""

    def _get(self, offset: int, dtype: npt.DTypeLike, count: int = 1,
             override_order: Literal["I", "S", "<"] | None = None) -> npt.NDArray[Any]:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        values = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype)[:count]
        return values.view(values.dtype.newbyteorder(self.byte_order if override_order is None else override_order))


def open_gguf(path: str) -> gguf.GGUFReader:
    """Memory-map a GGUF file (nothing is dequantized yet); read by ``_PlainViewReader`` under
    ``FOLOVLLM_GGUF_FAST_LOAD`` (on by default)."""
    try:
        return (_PlainViewReader if envs.switch("FOLOVLLM_GGUF_FAST_LOAD") else gguf.GGUFReader)(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read GGUF file {path!r}: {e}") from e


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_arch_config(reader: gguf.GGUFReader, name: str = "") -> ArchConfig:
    """Build the ArchConfig from GGUF metadata (``{arch}.block_count``, ``tokenizer.ggml.*`` ...)."""
    gguf_arch = _field(reader, "general.architecture")
    architecture = architecture_for_gguf(gguf_arch, name)
    defaults = get_model_class(architecture).gguf_defaults

    def key(suffix: str, default: Any = None) -> Any:
        return _field(reader, f"{gguf_arch}.{suffix}", default)

    required = ("embedding_length", "attention.head_count", "feed_forward_length", "block_count")
    missing = [k for k in required if key(k) is None]
    if missing:
        raise ValueError(f"GGUF {name!r} lacks metadata {[f'{gguf_arch}.{k}' for k in missing]}")
    hidden, num_heads = key("embedding_length"), key("attention.head_count")
    scaling_type = key("rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise ValueError(f"GGUF {name!r}: rope scaling {scaling_type!r} is not supported")
    rope_scaling = None
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": key("rope.scaling.factor")}
    rope_freqs = next((t for t in reader.tensors if t.name == _ROPE_FREQS), None)
    if rope_freqs is not None:  # llama.cpp's form of Llama 3's rope scaling: one divisor per frequency
        if rope_scaling is not None:
            raise ValueError(f"GGUF {name!r} has both rope scaling {scaling_type!r} and per-frequency factors")
        rope_scaling = {"rope_type": "freq_factors",
                        "factors": [float(f) for f in gguf.quants.dequantize(rope_freqs.data, rope_freqs.tensor_type)]}
    eos_ids = [_field(reader, f"tokenizer.ggml.{kind}_token_id") for kind in ("eos", "eot")]
    has_bias = any(t.name.endswith("attn_q.bias") for t in reader.tensors)
    num_layers = key("block_count")
    sliding_window, layer_types = key("attention.sliding_window"), []
    if sliding_window is not None and defaults.get("sliding_window_pattern"):
        pattern = int(key("attention.sliding_window_pattern", defaults["sliding_window_pattern"]))
        layer_types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]
    head_dim = key("attention.key_length") or hidden // num_heads
    return ArchConfig(
        architecture=architecture,
        vocab_size=key("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        intermediate_size=key("feed_forward_length"),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=key("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        layer_types=layer_types,
        sliding_window=sliding_window if layer_types else None,
        rope_local_theta=key("rope.freq_base_swa", defaults.get("rope_local_theta")),
        hidden_act=defaults.get("hidden_act", "silu"),
        # llama.cpp scales scores by head_dim^-1/2 for these models
        query_pre_attn_scalar=head_dim if layer_types else None,
        final_logit_softcapping=key("final_logit_softcapping"),
        max_position_embeddings=key("context_length", 2048),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        attention_bias=has_bias,
        attention_out_bias=any(t.name.endswith("attn_output.bias") for t in reader.tensors),
        eos_token_ids=list(dict.fromkeys(i for i in eos_ids if i is not None)),
        name=name,
    )


def iter_gguf_weights(
    reader: gguf.GGUFReader, arch: ArchConfig, model_class: type[CausalLM], int4: frozenset[str] = frozenset(),
    packed: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF parameter name, tensor) one at a time, so only one is dequantized at once.

    The GGUF tensors named in ``int4`` come as their int4 parts instead: ``<name>.qcodes``, ``.qscales``,
    ``.qzeros`` (``gguf_int4_parts``); those ``packed`` maps come as their file blocks (uint8 [rows, bytes
    per row]) under the parameter name it gives (``use_gguf_packed``); both with the rows permuted as the
    dequantized weight's are.
    The model class states llama.cpp's conventions for its architecture: q/k rows permuted for its
    rope layout (``gguf_qk_permuted``), norms stored with an offset (``gguf_norm_offset``), block
    tensor names that mean something else there (``gguf_block_tensors``); all undone here.
    """
    block_tensors = {**_BLOCK_TENSORS, **model_class.gguf_block_tensors}
    packed = packed or {}
    for tensor in reader.tensors:
        if tensor.name == _ROPE_FREQS:  # read into the ArchConfig's rope scaling, not a weight
            continue
        yield from _tensor_weights(reader, tensor, _hf_name(tensor.name, block_tensors), arch, model_class, int4,
                                   packed)
        _drop_mapped_pages(reader, tensor)  # copied by now (load_weights takes each as it comes)


def _tensor_weights(reader: gguf.GGUFReader, tensor: gguf.ReaderTensor, name: str, arch: ArchConfig,
                    model_class: type[CausalLM], int4: frozenset[str],
                    packed: Mapping[str, str]) -> Iterator[tuple[str, torch.Tensor]]:
    """One GGUF tensor's (HF parameter name, tensor) pairs, as ``iter_gguf_weights`` says."""
    if tensor.name in packed:
        if envs.switch("FOLOVLLM_GGUF_FAST_LOAD"):
            _populate_mapped_pages(reader, tensor)
        with warnings.catch_warnings():  # the file's mapped bytes, read (packed) and never written
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            blocks = torch.from_numpy(tensor.data.reshape(int(tensor.shape[1]), -1))
        yield packed[tensor.name], _undo_qk_permutation(name, blocks, arch, model_class)
        return
    if tensor.name in int4:
        rows, cols = int(tensor.shape[1]), int(tensor.shape[0])  # GGUF lists the fastest dimension first
        parts = gguf_int4_parts(tensor.data, tensor.tensor_type, rows, cols)
        base = name.removesuffix(".weight")
        for part_name, part in zip(GGUF_INT4_TENSORS, parts):
            yield f"{base}.{part_name}", _undo_qk_permutation(name, part, arch, model_class)
        return
    # np.array copies: F32 tensors come back as views of the read-only mmap
    weights = torch.from_numpy(np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type)))
    if model_class.gguf_norm_offset and name.endswith("norm.weight"):
        weights = weights - model_class.gguf_norm_offset
    yield name, _undo_qk_permutation(name, weights, arch, model_class).float()


def _mapped_range(reader: gguf.GGUFReader, tensor: gguf.ReaderTensor) -> tuple[mmap.mmap, int, int] | None:
    """The file mapping and the page-aligned (start, length) of ``tensor``'s bytes in it; None without one."""
    mapping = getattr(reader.data, "_mmap", None)  # numpy's memmap keeps its mmap.mmap there
    if mapping is None:
        return None
    start = tensor.data_offset // mmap.PAGESIZE * mmap.PAGESIZE
    return mapping, start, tensor.data_offset + tensor.n_bytes - start


def _populate_mapped_pages(reader: gguf.GGUFReader, tensor: gguf.ReaderTensor) -> None:
    """Maps ``tensor``'s pages (MADV_POPULATE_READ, Linux 5.14 on) in one call before the pack op's threads read
    them: faulted in by the threads a row at a time, an 8B file's took the op 2.6 s, not 1.9 s."""
    where = _mapped_range(reader, tensor)
    if where is None or _MADV_POPULATE_READ is None:
        return
    mapping, start, length = where
    try:
        mapping.madvise(_MADV_POPULATE_READ, start, length)
    except OSError:  # a kernel before 5.14 (EINVAL): the pages fault in as they are read
        pass


def _drop_mapped_pages(reader: gguf.GGUFReader, tensor: gguf.ReaderTensor) -> None:
    """Unmaps ``tensor``'s pages of the file from this process (MADV_DONTNEED; the mapping is read-only, so a
    later read faults them in again from the page cache): else loading holds the whole file resident beside the
    weights it made, twice a model's size at the peak (4.6 GiB more for an 8B Q4_K_M file)."""
    where = _mapped_range(reader, tensor)
    if where is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    mapping, start, length = where
    mapping.madvise(mmap.MADV_DONTNEED, start, length)


def gguf_int4_layers(reader: gguf.GGUFReader, model: CausalLM) -> dict[str, list[str]]:
    """The decoder linears of ``model`` whose every checkpoint piece is a GGUF 4-bit type the CPU int4
    kernel takes (``GGUF_INT4_TYPES``), each with the GGUF tensors that fill it. The LM head is left out
    (it stays unquantized, as for every quantized checkpoint); so is a merged linear with any piece in
    another type (Q5_*, Q6_K, Q8_0: dequantized), since one layer holds one format."""
    block_tensors = {**_BLOCK_TENSORS, **model.gguf_block_tensors}
    pieces: dict[str, list[gguf.ReaderTensor]] = {}
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and tensor.name.endswith(".weight"):
            target, _ = checkpoint_target(model, _hf_name(tensor.name, block_tensors))
            pieces.setdefault(target.removesuffix(".weight"), []).append(tensor)
    layers = {}
    for module_name, tensors in pieces.items():
        layer = model.get_submodule(module_name)
        if (isinstance(layer, LinearBase) and all(t.tensor_type in GGUF_INT4_TYPES for t in tensors)
                and gguf_int4_fits(layer.input_size, layer.output_size)):
            layers[module_name] = [t.name for t in tensors]
    return layers


def use_gguf_int4(reader: gguf.GGUFReader, model: CausalLM, kernels: LinearKernels) -> frozenset[str]:
    """Switch the linears whose GGUF pieces are all 4-bit to the int4 method; the GGUF tensors to keep packed."""
    layers = gguf_int4_layers(reader, model)
    for name in layers:
        model.get_submodule(name).use_method(GGUFInt4LinearMethod(kernels))
    total = sum(1 for m in model.modules() if isinstance(m, LinearBase))
    logger.info("load_quantized: %d of %d linear layers keep their GGUF 4-bit weights (the rest dequantized)",
                len(layers), total)
    return frozenset(t for tensors in layers.values() for t in tensors)


def use_gguf_packed(reader: gguf.GGUFReader, model: CausalLM, quantize_lm_head: str,
                    a8_rows: int = 0) -> dict[str, str]:
    """Switch every linear whose GGUF pieces are all packable (``gguf_native.packable``) to the packed GGUF
    method, and hold the embedding table (and, under ``quantize_lm_head`` auto, the LM head) in its file
    type where packable; the map of GGUF tensor name -> the parameter that loads its blocks. A merged linear
    with a piece in another type, and every layer split over tensor-parallel ranks, stays dequantized."""
    block_tensors = {**_BLOCK_TENSORS, **model.gguf_block_tensors}
    pieces: dict[str, list[tuple[object, gguf.ReaderTensor]]] = {}
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and tensor.name.endswith(".weight"):
            target, shard = checkpoint_target(model, _hf_name(tensor.name, block_tensors))
            pieces.setdefault(target.removesuffix(".weight"), []).append((shard, tensor))
    names: dict[str, str] = {}
    for module_name, tensors in pieces.items():
        layer = model.get_submodule(module_name)
        if not isinstance(layer, LinearBase) or layer.tp_size != 1:
            continue
        order = list(layer.shard_ids()) if isinstance(layer, MergedColumnParallelLinear) else [None]
        if sorted(order, key=str) != sorted((shard for shard, _ in tensors), key=str):
            continue
        tensors.sort(key=lambda piece: order.index(piece[0]))
        types = [(int(t.tensor_type), int(t.shape[1])) for _, t in tensors]
        if not all(packable(qtype, rows, layer.input_size) for qtype, rows in types):
            continue
        layer.use_method(GGUFPackedLinearMethod(types, a8_rows=a8_rows))
        names.update({t.name: f"{module_name}.gguf.piece{i}" for i, (_, t) in enumerate(tensors)})
    packed_linears = len(names)
    names.update(_use_packed_vocabulary(reader, model, quantize_lm_head, a8_rows))
    total = sum(1 for m in model.modules() if isinstance(m, LinearBase))
    packed_layers = sum(isinstance(m.method, GGUFPackedLinearMethod) for m in model.modules() if isinstance(m, LinearBase))
    logger.info("load_quantized: %d of %d linear layers keep their GGUF types (%d tensors; the rest dequantized)%s",
                packed_layers, total, packed_linears,
                ", the embedding table too" if "token_embd.weight" in names else "")
    return names


def _use_packed_vocabulary(reader: gguf.GGUFReader, model: CausalLM, quantize_lm_head: str,
                           a8_rows: int = 0) -> dict[str, str]:
    """The embedding table packed where its type is (its lookup reads rows from it); the LM head packed where
    its tensor is (output.weight, or the table it is tied to) and ``quantize_lm_head`` is auto (on: int8,
    off: the model dtype, as for any checkpoint), int8 activations from ``a8_rows`` rows on as the linears."""
    tensors = {t.name: t for t in reader.tensors}
    embedding, head = model.get_submodule(_GLOBAL_TENSORS["token_embd"]), model.lm_head
    if not isinstance(embedding, VocabEmbedding) or embedding.tp_size != 1 or head.tp_size != 1:
        return {}
    table = tensors.get("token_embd.weight")
    output = tensors.get("output.weight")
    head_packs = quantize_lm_head == "auto"
    names = {}
    if table is not None and packable(int(table.tensor_type), embedding.vocab_size, int(table.shape[0])) and (
            head.tied is None or head_packs):
        rows = GGUFWeight([(int(table.tensor_type), embedding.vocab_size)], int(table.shape[0]))
        embedding.read_rows_from(rows)  # the embedding holds the table (a submodule)
        names[table.name] = f"{_GLOBAL_TENSORS['token_embd']}.row_table.piece0"
        if head.tied is not None:  # the head multiplies by the same table
            head.use_method(GGUFPackedLinearMethod(rows.pieces, shared=rows, a8_rows=a8_rows))
    if head.tied is None and head_packs and output is not None and packable(
            int(output.tensor_type), head.output_size, head.input_size):
        head.use_method(GGUFPackedLinearMethod([(int(output.tensor_type), head.output_size)], a8_rows=a8_rows))
        names[output.name] = "lm_head.gguf.piece0"
    return names


def _undo_qk_permutation(name: str, rows: torch.Tensor, arch: ArchConfig, model_class: type[CausalLM]) -> torch.Tensor:
    """A q/k projection's rows (weights, or int4 codes, scales and zeros) in HF's order."""
    if model_class.gguf_qk_permuted:
        if ".q_proj." in name:
            return unpermute_qk(rows, arch.num_attention_heads)
        if ".k_proj." in name:
            return unpermute_qk(rows, arch.num_key_value_heads)
    return rows


def unpermute_qk(weights: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: per head, rows (half, pair) -> (pair, half)."""
    rows = weights.shape[0]
    half = rows // num_heads // 2
    w = weights.reshape(num_heads, half, 2, *weights.shape[1:])
    return w.transpose(1, 2).reshape(weights.shape)


def _hf_name(gguf_name: str, block_tensors: dict[str, str]) -> str:
    base, _, kind = gguf_name.rpartition(".")
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{kind}"
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in block_tensors:
        raise ValueError(f"GGUF tensor {gguf_name!r} is not supported by this loader")
    layer, piece, kind = match.groups()
    return f"model.layers.{layer}.{block_tensors[piece]}.{kind}"
