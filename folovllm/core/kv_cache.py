"""Paged KV cache bookkeeping: a pool of fixed-size blocks and each request's block table.

Only ids live here; the K/V tensors themselves are owned by the model runner. Token ``i`` of a
request is stored at slot ``block_table[i // block_size] * block_size + i % block_size``.
Blocks carry ref counts so that several requests can share one (prefix caching builds on this).
"""
from __future__ import annotations

from collections import deque

from folovllm.request import Request


class BlockPool:
    """Fixed set of block ids with ref counts; a block is free when its ref count is zero."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks, only {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(count)]
        for block in blocks:
            self.ref_counts[block] = 1
        return blocks

    def release(self, blocks: list[int]) -> None:
        """Drops one reference to each block; blocks no one holds go back to the free queue."""
        for block in reversed(blocks):  # tail first: the head of a sequence is the likelier to be reused
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"block {block} released more often than allocated")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free.append(block)


class KVCacheManager:
    """Gives each request the blocks its tokens need, on demand, and takes them back at the end."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self._num_slots_used: dict[str, int] = {}  # tokens each request has slots for
        self.total_slots_used = 0
        self.peak_blocks_used = 0
        self.peak_used_slots = 0  # most tokens stored while the peak number of blocks was in use

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        total_tokens = request.num_computed_tokens + num_new_tokens
        have = len(self.block_tables.get(request.request_id, ()))
        return max(0, -(-total_tokens // self.block_size) - have)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Makes room for ``num_new_tokens`` more tokens; False (nothing changed) if blocks run out."""
        needed = self.num_blocks_needed(request, num_new_tokens)
        if needed > self.pool.num_free_blocks:
            return False
        table = self.block_tables.setdefault(request.request_id, [])
        table.extend(self.pool.allocate(needed))
        slots = request.num_computed_tokens + num_new_tokens
        self.total_slots_used += slots - self._num_slots_used.get(request.request_id, 0)
        self._num_slots_used[request.request_id] = slots
        if self.num_used_blocks > self.peak_blocks_used:
            self.peak_blocks_used = self.num_used_blocks
            self.peak_used_slots = self.total_slots_used
        elif self.num_used_blocks == self.peak_blocks_used:  # the fullest the peak blocks got
            self.peak_used_slots = max(self.peak_used_slots, self.total_slots_used)
        return True

    def free(self, request: Request) -> None:
        """Releases every block of the request (finish, abort or preemption)."""
        table = self.block_tables.pop(request.request_id, None)
        if table:
            self.pool.release(table)
        self.total_slots_used -= self._num_slots_used.pop(request.request_id, 0)

    def stats(self) -> dict:
        return {"num_blocks": self.num_blocks, "block_size": self.block_size,
                "blocks_used": self.num_used_blocks, "peak_blocks_used": self.peak_blocks_used,
                "peak_used_slots": self.peak_used_slots,
                "peak_usage": self.peak_blocks_used / self.num_blocks}
