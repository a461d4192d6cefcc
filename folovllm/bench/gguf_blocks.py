"""Random GGUF blocks of the types our kernel holds packed, as a file would store them (for benchmarks and tests).

Codes, sub-block scales and mins are random bytes; each block's fp16 d (and dmin) is set to a plausible
size, so the weights are finite and of a model's magnitude (below about 0.2).
"""
from __future__ import annotations

import numpy as np

# ggml type: (weights, bytes) of a block, and the byte offsets of its fp16 scales (d, dmin)
BLOCKS = {
    "Q4_0": (2, 32, 18, (0,)),
    "Q4_1": (3, 32, 20, (0, 2)),
    "Q8_0": (8, 32, 34, (0,)),
    "Q4_K": (12, 256, 144, (0, 2)),
    "Q5_K": (13, 256, 176, (0, 2)),
    "Q6_K": (14, 256, 210, (208,)),
}


def type_id(name: str) -> int:
    """The ggml type id of a type name (Q4_K -> 12); ValueError naming the known ones."""
    if name not in BLOCKS:
        raise ValueError(f"unknown GGUF type {name!r}; held packed: {', '.join(BLOCKS)}")
    return BLOCKS[name][0]


def random_gguf_blocks(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, bytes per row]: ``rows`` rows of ``cols`` weights in type ``name``'s blocks."""
    _, weights, size, scales = BLOCKS[name]
    if cols % weights:
        raise ValueError(f"a {name} row of {cols} weights is not a whole number of {weights}-weight blocks")
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // weights, size), dtype=np.uint8)
    # d times a sub-block scale (K types: up to 63) times a code (up to 15, 31, 63; Q8_0 127): weights below ~0.2
    magnitude = {"Q4_K": 2e-4, "Q5_K": 1e-4, "Q6_K": 5e-5, "Q8_0": 1.5e-3}.get(name, 2e-2)
    for at in scales:
        values = rng.uniform(magnitude / 20, magnitude, (len(blocks), 1)).astype(np.float16)
        blocks[:, at:at + 2] = values.view(np.uint8)
    return blocks.reshape(rows, -1)
