"""GGUF tensors and files for the tests: blocks of every packable type, a tiny Llama GGUF in chosen types."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from folovllm.bench.gguf_blocks import random_gguf_blocks

Q = gguf.GGMLQuantizationType
PACKED_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
QUANTIZABLE = (Q.Q4_0, Q.Q4_1, Q.Q8_0)  # the gguf package quantizes these; the K types it only reads


def random_blocks(qtype: gguf.GGMLQuantizationType, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """[rows, bytes per row] of ``qtype`` blocks: numpy-quantized random weights (Q4_0, Q4_1, Q8_0), or random
    K super-blocks (random codes, scales and mins; fp16 d and dmin of a plausible size)."""
    if qtype in QUANTIZABLE:
        rng = np.random.default_rng(seed)
        return gguf.quants.quantize(rng.normal(0, 0.05, (rows, cols)).astype(np.float32), qtype)
    return random_gguf_blocks(qtype.name, rows, cols, seed)


def write_tiny_llama_gguf(path: Path, layer_types: list[dict[str, gguf.GGMLQuantizationType]],
                          embedding: gguf.GGMLQuantizationType | None = None,
                          output: gguf.GGMLQuantizationType | None = None, hidden: int = 256, inter: int = 512,
                          vocab: int = 320, default: gguf.GGMLQuantizationType = Q.Q4_1) -> None:
    """A Llama GGUF with one layer per entry of ``layer_types`` (piece -> type, F32 for plain floats; others
    ``default``), random blocks under llama.cpp's names; the embedding table F32 (or ``embedding``'s type) and tied, unless
    ``output`` gives the head a tensor of its own."""
    heads, kv_heads = 4, 2
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(len(layer_types))
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    rng = np.random.default_rng(3)
    if embedding is None:
        writer.add_tensor("token_embd.weight", rng.normal(0, 0.5, (vocab, hidden)).astype(np.float32))
    else:
        writer.add_tensor("token_embd.weight", random_blocks(embedding, vocab, hidden, seed=1), raw_dtype=embedding)
    if output is not None:
        writer.add_tensor("output.weight", random_blocks(output, vocab, hidden, seed=2), raw_dtype=output)
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    head_dim = hidden // heads
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv_heads * head_dim, hidden),
              "attn_v": (kv_heads * head_dim, hidden), "attn_output": (hidden, hidden),
              "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden), "ffn_down": (hidden, inter)}
    for i, types in enumerate(layer_types):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        for j, (piece, (rows, cols)) in enumerate(shapes.items()):
            qtype = types.get(piece, default)
            if qtype == Q.F32:
                writer.add_tensor(f"blk.{i}.{piece}.weight", rng.normal(0, 0.05, (rows, cols)).astype(np.float32))
            else:
                writer.add_tensor(f"blk.{i}.{piece}.weight", random_blocks(qtype, rows, cols, seed=10 * i + j),
                                  raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
