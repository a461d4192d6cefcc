"""Several small integers in one int32: the packing GPTQ checkpoints use for weights and zero points.

``bits``-wide codes (4 or 8 here, 32 // bits of them per int32) are laid along one dimension, the
first code in the lowest bits. GPTQ packs ``qweight`` [in, out] along the input dimension (dim 0)
and ``qzeros`` [groups, out] along the output dimension (dim 1).
"""
from __future__ import annotations

import torch

PACK_BITS = (2, 4, 8)


def _check_bits(bits: int) -> int:
    if bits not in PACK_BITS:
        raise ValueError(f"cannot pack {bits}-bit codes into int32; supported bits: {PACK_BITS}")
    return 32 // bits


def pack_int32(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Integer codes in [0, 2**bits) -> int32, 32 // bits codes per element along ``dim``."""
    per_int = _check_bits(bits)
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ValueError(f"codes must be an integer tensor, got {codes.dtype}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 2**bits):
        raise ValueError(f"{bits}-bit codes must lie in [0, {2**bits}); got [{int(codes.min())}, {int(codes.max())}]")
    size = codes.shape[dim]
    if size % per_int:
        raise ValueError(f"dimension {dim} has size {size}, not a multiple of {per_int} ({bits}-bit codes)")
    moved = codes.movedim(dim, -1).to(torch.int64)
    grouped = moved.reshape(*moved.shape[:-1], size // per_int, per_int)
    shifts = torch.arange(per_int, dtype=torch.int64, device=codes.device) * bits
    words = (grouped << shifts).sum(dim=-1)  # disjoint bit fields: the sum is the bitwise or
    words = torch.where(words >= 2**31, words - 2**32, words)  # the same 32 bits, as a signed int32
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The inverse of ``pack_int32``: int32 -> int32 codes in [0, 2**bits), ``32 // bits`` times longer along ``dim``."""
    per_int = _check_bits(bits)
    if packed.dtype != torch.int32:
        raise ValueError(f"packed codes must be int32, got {packed.dtype}")
    moved = packed.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per_int, dtype=torch.int64, device=packed.device) * bits
    codes = (moved.unsqueeze(-1) >> shifts) & (2**bits - 1)
    codes = codes.reshape(*moved.shape[:-1], moved.shape[-1] * per_int)
    return codes.to(torch.int32).movedim(-1, dim).contiguous()
