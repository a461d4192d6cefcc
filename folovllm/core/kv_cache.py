"""Paged KV cache bookkeeping: a pool of fixed-size blocks, each request's block table, and the
automatic prefix cache on top.

Only ids live here; the K/V tensors themselves are owned by the model runner. Token ``i`` of a
request is stored at slot ``block_table[i // block_size] * block_size + i % block_size``.

Prefix caching: a FULL block is named by a chained hash of (parent block's hash, its token ids,
extra keys: model identity and the request's cache salt). A request that starts with blocks whose
hashes are known shares those blocks (ref count + 1) instead of recomputing them. Blocks no one
holds stay cached until a fresh block is needed; then the least recently freed goes first.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

from folovllm.paging import blocks_for_tokens
from folovllm.request import Request

BlockHash = bytes


def hash_block(parent: BlockHash | None, token_ids: list[int], extra_key: bytes) -> BlockHash:
    """SHA-256 chain: a false hit would need a SHA-256 collision. Extra keys seed the chain."""
    digest = hashlib.sha256(parent if parent is not None else b"root:" + extra_key)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class BlockPool:
    """Fixed set of block ids with ref counts, and the hash -> block map of cached full blocks.

    A block with ref count 0 is either plain free (no hash) or evictable (cached, hash kept);
    fresh blocks come from the plain free ones first, then the least recently used evictable.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[BlockHash | None] = [None] * num_blocks
        self.cached: dict[BlockHash, int] = {}
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # first = least recently freed

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation can take (evicting cached ones if needed)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self._evictable)

    def allocate(self, count: int) -> list[int]:
        if count > self.num_free_blocks:
            raise RuntimeError(f"asked for {count} blocks, only {self.num_free_blocks} free")
        blocks = []
        for _ in range(count):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                del self.cached[self.block_hashes[block]]
                self.block_hashes[block] = None
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: list[int]) -> None:
        """Takes one more reference to cached blocks (a prefix hit); they stop being evictable."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self._evictable[block]
            self.ref_counts[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drops one reference to each block; blocks no one holds become free or evictable."""
        for block in reversed(blocks):  # tail first, so a sequence's tail is evicted before its head
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"block {block} released more often than allocated")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if self.block_hashes[block] is None:
                    self._free.append(block)
                else:
                    self._evictable[block] = None

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Names a full, computed block so later requests can hit it (first writer wins)."""
        if block_hash not in self.cached and self.block_hashes[block] is None:
            self.cached[block_hash] = block
            self.block_hashes[block] = block_hash

    def reset_cache(self) -> int:
        """Forgets every cached block that no request holds; returns how many were dropped."""
        dropped = list(self._evictable)
        for block in dropped:
            del self.cached[self.block_hashes[block]]
            self.block_hashes[block] = None
            self._free.append(block)
        self._evictable.clear()
        return len(dropped)


class KVCacheManager:
    """Gives each request the blocks its tokens need, on demand, and takes them back at the end."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 model_key: str = "", reserve_tokens_per_request: int = 0) -> None:
        self.block_size = block_size
        # > 0: the "contiguous" layout ablation (the ladder's first rung): every request holds blocks for this
        # many tokens from its first step on, as if it had one max_model_len buffer.
        self.reserve_tokens_per_request = reserve_tokens_per_request
        self.pool = BlockPool(num_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.model_key = model_key.encode()
        self.block_tables: dict[str, list[int]] = {}
        # finished requests' blocks kept for a KV transfer to another instance, by transfer id
        self.held: dict[str, list[int]] = {}
        self._num_slots_used: dict[str, int] = {}  # tokens each request has slots for
        self._num_cached_blocks: dict[str, int] = {}  # leading blocks of a request already named
        self.total_slots_used = 0
        self.peak_blocks_used = 0
        self.peak_used_slots = 0  # most tokens stored while the peak number of blocks was in use
        self._at_peak = False  # the blocks in use are the peak's: more stored tokens raise peak_used_slots
        # blocks each request got since the scheduler last took them (``take_new_blocks``): a worker that
        # keeps the requests' tables is sent these instead of whole tables
        self.new_blocks: dict[str, tuple[int, list[int]]] = {}
        self.prefix_cache_queries = 0  # tokens looked up at admission
        self.prefix_cache_hits = 0  # of those, tokens found cached

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

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks of this cache's size that hold ``num_tokens`` tokens."""
        return blocks_for_tokens(num_tokens, self.block_size)

    # -- prefix cache ---------------------------------------------------------------------------

    def _block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """The request's full-block hashes, extended (never recomputed) to ``num_blocks``."""
        hashes = request.block_hashes
        size = self.block_size
        extra = self.model_key + b"|salt:" + (request.cache_salt or "").encode()
        if request.lora_request is not None:  # an adapter's KV differs from the base model's and other adapters'
            extra += request.lora_request.cache_key()
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, request.token_ids[i * size:(i + 1) * size], extra))
        return hashes

    def find_cached_prefix(self, request: Request) -> list[int]:
        """The longest run of cached full blocks the request starts with (its last token excluded)."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size  # the last token's logits are needed
        hits = []
        for block_hash in self._block_hashes(request, max_blocks):
            block = self.pool.cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def cache_computed_blocks(self, request: Request) -> None:
        """Names the request's blocks that are now full and computed, so others can share them."""
        if not self.enable_prefix_caching:
            return
        table = self.block_tables.get(request.request_id)
        if table is None:
            return
        # Only known tokens are named: under overlap the last computed one may still be pending.
        num_full = min(request.num_computed_tokens, len(request.token_ids)) // self.block_size
        start = self._num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self._block_hashes(request, num_full)
        for i in range(start, num_full):
            self.pool.cache(table[i], hashes[i])
        self._num_cached_blocks[request.request_id] = num_full

    def cache_full_blocks(self, requests: list[Request]) -> None:
        """``cache_computed_blocks`` for each request; one whose full computed blocks are all named costs a
        comparison (the engine calls it for every request of every step)."""
        if not self.enable_prefix_caching:
            return
        size, named = self.block_size, self._num_cached_blocks.get
        for request in requests:
            computed, known = request.num_computed_tokens, len(request.token_ids)
            if (computed if computed < known else known) // size > named(request.request_id, 0):  # min() costs a call
                self.cache_computed_blocks(request)

    def reset_prefix_cache(self) -> int:
        return self.pool.reset_cache()

    # -- allocation -----------------------------------------------------------------------------

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       cached_blocks: list[int] | None = None) -> bool:
        """Makes room for ``num_new_tokens`` more tokens after ``cached_blocks`` (prefix hits).

        Returns False, with nothing changed, if the blocks run out.
        """
        request_id = request.request_id
        table = self.block_tables.get(request_id)
        if not cached_blocks and table is not None:  # a running request: most steps need no block
            total_tokens = request.num_computed_tokens + num_new_tokens
            if max(total_tokens, self.reserve_tokens_per_request) <= len(table) * self.block_size:
                self._record_slots(request_id, total_tokens)
                return True
        cached_blocks = cached_blocks or []
        table = table or []
        num_computed = request.num_computed_tokens + len(cached_blocks) * self.block_size
        total_tokens = num_computed + num_new_tokens
        held_tokens = max(total_tokens, self.reserve_tokens_per_request)
        needed = max(0, self.blocks_for_tokens(held_tokens) - len(table) - len(cached_blocks))
        # Hit blocks nobody holds are counted as free until we take them.
        reusable = sum(1 for b in cached_blocks if self.pool.ref_counts[b] == 0)
        if needed > self.pool.num_free_blocks - reusable:
            return False
        table = self.block_tables.setdefault(request.request_id, table)
        if cached_blocks:
            self.pool.touch(cached_blocks)
            table.extend(cached_blocks)
            self._num_cached_blocks[request.request_id] = len(cached_blocks)
        if needed:
            first = len(table)
            table.extend(self.pool.allocate(needed))
            known = self.new_blocks.get(request_id)
            self.new_blocks[request_id] = (known[0], table[known[0]:]) if known else (first, table[first:])
        self._record_slots(request_id, total_tokens)
        used = self.num_used_blocks
        if used > self.peak_blocks_used:
            self.peak_blocks_used = used
            self.peak_used_slots = self.total_slots_used
        elif used == self.peak_blocks_used:  # the fullest the peak blocks got
            self.peak_used_slots = max(self.peak_used_slots, self.total_slots_used)
        self._at_peak = used == self.peak_blocks_used
        return True

    def decode_tables(self, requests: list[Request]) -> list[list[int]]:
        """``allocate_slots(request, 1)`` for each of ``requests`` (running, each computing one token) in turn,
        up to the first that finds no block; returns their block tables. One whose blocks have a slot for its
        token costs a comparison and its slot count: no call."""
        tables, used, size, reserve = self.block_tables, self._num_slots_used, self.block_size, \
            self.reserve_tokens_per_request
        total_used, peak, at_peak = self.total_slots_used, self.peak_used_slots, self._at_peak
        found: list[list[int]] = []
        for request in requests:
            request_id = request.request_id
            total = request.num_computed_tokens + 1
            table = tables.get(request_id)
            if table is None:
                break
            capacity = len(table) * size
            if total > capacity or reserve > capacity:  # a new block: the general path, on the counts as they are
                self.total_slots_used, self.peak_used_slots = total_used, peak
                if not self.allocate_slots(request, 1):
                    return found
                total_used, peak, at_peak = self.total_slots_used, self.peak_used_slots, self._at_peak
            else:
                total_used += total - used[request_id]  # a request with a table has its slots recorded
                used[request_id] = total
                if at_peak and total_used > peak:
                    peak = total_used
            found.append(table)
        self.total_slots_used, self.peak_used_slots = total_used, peak
        return found

    def _record_slots(self, request_id: str, total_tokens: int) -> None:
        """The request now has slots for ``total_tokens`` tokens; the fullest the peak blocks got is kept."""
        self.total_slots_used += total_tokens - self._num_slots_used.get(request_id, 0)
        self._num_slots_used[request_id] = total_tokens
        if self._at_peak and self.total_slots_used > self.peak_used_slots:
            self.peak_used_slots = self.total_slots_used

    def take_new_blocks(self) -> dict[str, tuple[int, list[int]]]:
        """The blocks each request got since the last call: request id -> (index of its first new block in
        its table, those blocks)."""
        new, self.new_blocks = self.new_blocks, {}
        return new

    def free(self, request: Request) -> None:
        """Releases every block of the request (finish, abort or preemption); cached ones stay named."""
        table = self.block_tables.pop(request.request_id, None)
        if table:
            self.pool.release(table)
        self.total_slots_used -= self._num_slots_used.pop(request.request_id, 0)
        self._num_cached_blocks.pop(request.request_id, None)
        self.new_blocks.pop(request.request_id, None)
        self._at_peak = self.num_used_blocks == self.peak_blocks_used

    def hold(self, request: Request, transfer_id: str) -> None:
        """Keeps a finished request's blocks, under ``transfer_id``, until ``release_held``: another
        instance reads them (KV transfer). Named blocks stay named."""
        table = self.block_tables.pop(request.request_id, [])
        self.total_slots_used -= self._num_slots_used.pop(request.request_id, 0)
        self._num_cached_blocks.pop(request.request_id, None)
        self.new_blocks.pop(request.request_id, None)
        self.held[transfer_id] = table

    def release_held(self, transfer_id: str) -> None:
        """The transfer ended (or timed out): the held blocks go back to the pool."""
        table = self.held.pop(transfer_id, None)
        if table:
            self.pool.release(table)
        self._at_peak = self.num_used_blocks == self.peak_blocks_used

    def stats(self) -> dict:
        return {"num_blocks": self.num_blocks, "block_size": self.block_size,
                "blocks_used": self.num_used_blocks, "peak_blocks_used": self.peak_blocks_used,
                "peak_used_slots": self.peak_used_slots,
                "peak_usage": self.peak_blocks_used / self.num_blocks,
                "prefix_cache_queries": self.prefix_cache_queries,
                "prefix_cache_hits": self.prefix_cache_hits}
