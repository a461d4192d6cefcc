"""A CPU model's weights moved into one block of memory backed by 2 MiB pages (Linux transparent huge pages).

A decode step reads every weight once, far more bytes than the caches hold, from hundreds of separately
allocated tensors on 4 KiB pages: each page costs a TLB miss and a page walk (the software prefetches of
our int4 and int8 kernels walk too). On 2 MiB pages the whole model fits the TLB: per layer shape our
int4 matmuls at one row took 0.92-0.96x the time with weights streamed (one thread, CPU time, alternating
rounds; the same weights laid out contiguously on 4 KiB pages: no change, so it is the pages).

Every tensor keeps its identity: its storage is copied into the block and the tensor pointed at the copy
(``Tensor.set_``), so anything already holding it (direct-call closures, tied weights) sees the move, and
tensors sharing a storage share it again. ``FOLOVLLM_HUGE_PAGE_WEIGHTS`` (on | off, default on); where
the kernel does not take the advice (not Linux, THP off), the block is plain memory and nothing else changes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

import torch
from torch import nn

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each storage starts on a cache line
MADV_HUGEPAGE = 14  # Linux's value
TRIM_BYTES = 1 << 20  # after moving a storage this large, the heap's free pages go back to the OS
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None
# tcmalloc's C entry point, where the process has it (preloaded: its symbols are global); else None
_TCMALLOC_RELEASE = getattr(ctypes.CDLL(None), "MallocExtension_ReleaseFreeMemory", None) if _LIBC else None


def _advise_huge_pages(block: torch.Tensor) -> bool:
    """madvise(MADV_HUGEPAGE) on the 2 MiB-aligned part of ``block``'s memory; whether the kernel took it."""
    if _LIBC is None:
        return False
    start = -(-block.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    length = (block.data_ptr() + block.numel() - start) // HUGE_PAGE * HUGE_PAGE
    if length <= 0:
        return False
    return _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_HUGEPAGE) == 0


def move_weights_to_huge_pages(module: nn.Module) -> int:
    """Moves ``module``'s CPU parameters and buffers into one huge-page block; returns the bytes moved."""
    tensors = [t for t in (*module.parameters(), *module.buffers())  # oneDNN's packed weights have no storage
               if t is not None and t.device.type == "cpu" and t.layout == torch.strided and not t.is_mkldnn]
    groups: dict[int, list[torch.Tensor]] = {}  # storage data_ptr -> the tensors on it
    for t in tensors:
        if t.untyped_storage().nbytes() > 0:
            groups.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    offsets, size = {}, 0  # each storage's byte offset in the block
    for ptr, group in groups.items():
        offsets[ptr] = size
        size += -(-group[0].untyped_storage().nbytes() // ALIGN) * ALIGN
    if size == 0:
        return 0
    # room to start the first storage on a 2 MiB boundary, so the block's huge pages cover all of it
    raw = torch.empty(size + HUGE_PAGE, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % HUGE_PAGE
    advised = _advise_huge_pages(raw[skip:skip + size])
    target = raw.untyped_storage()
    with torch.no_grad():
        for ptr, group in groups.items():  # one storage at a time: each old one can go as soon as it moved
            storage = group[0].untyped_storage()
            start = skip + offsets[ptr]
            raw[start:start + storage.nbytes()].copy_(_bytes_of(storage))
            for t in group:
                t.set_(target, (start + t.storage_offset() * t.element_size()) // t.element_size(), t.shape, t.stride())
            moved = storage.nbytes()
            del storage
            if moved >= TRIM_BYTES:
                _release_freed_memory()
    logger.info("weights: %.1f MiB moved into one block%s", size / 2**20,
                " on 2 MiB pages" if advised else " (the kernel declined 2 MiB pages)")
    return size


def _release_freed_memory() -> None:
    """Hands the allocator's free pages back to the OS: loading allocates and frees weight-sized buffers, so the
    heap serves weights from its own pages, and a storage freed here leaves a hole that stays resident without
    this. glibc's ``malloc_trim`` (~200 MiB of the default model); tcmalloc's ``ReleaseFreeMemory`` where it is
    preloaded (it keeps every freed span, and ``malloc_trim`` does not reach them: the old copies of all the
    weights, 4.7 GiB of an 8B Q4_K_M model)."""
    if _TCMALLOC_RELEASE is not None:
        _TCMALLOC_RELEASE()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of ``storage``'s bytes."""
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
