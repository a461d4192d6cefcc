"""Which data-parallel replica a new request goes to, from what the server sees of each replica.

Load: a replica's outstanding tokens, the work it has been given and not yet done: each of its open
requests counts the prompt tokens it has still to compute (all but the prefix it is expected to find
cached, until its first output shows the prefill done) plus the tokens it may still generate
(``n * max_tokens`` less those already generated). It is tracked from the server's own traffic:
a routed add, each iteration's outputs, and the finish, abort, failure or refusal that ends it.

Prefix-aware routing (``prefix_aware``): each replica keeps an approximate record of the prompts
routed to it, as chained hashes of their full KV blocks (the granularity its prefix cache shares at),
bounded and least-recently-used first out, as its KV cache would evict. A request goes to the replica
whose record holds the longest prefix of its prompt, when that is at least ``min_match_tokens`` and
that replica is not overloaded against the least loaded one (``load > balance_factor * least +
balance_slack_tokens``); otherwise to the least loaded. Ties go round the replicas in turn, so an idle
set of replicas takes sequential requests in turn rather than all on the first.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from folovllm.config import DP_ROUTING_POLICIES


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """One hash per full block of ``token_ids``, each chained to the blocks before it."""
    hashes, previous = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        previous = hash((previous, tuple(token_ids[start:start + block_size])))
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """One replica's recently routed prompt blocks (chained hashes), least recently used evicted first."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"a prefix index needs room for at least one block; got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: list[int]) -> int:
        """How many leading blocks of a prompt (its ``block_hashes``) this replica was last sent."""
        matched = 0
        for block_hash in hashes:
            if block_hash not in self._blocks:
                break
            matched += 1
        return matched

    def insert(self, hashes: list[int]) -> None:
        for block_hash in hashes:
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)


@dataclass(frozen=True)
class RouterSettings:
    """How the router chooses; ``policy`` is one of DP_ROUTING_POLICIES (``--dp-routing``)."""

    policy: str = "prefix_aware"
    block_size: int = 16
    max_model_len: int = 2048  # a request without max_tokens may generate up to this, less its prompt
    min_match_tokens: int = 16  # a shorter shared prefix is not worth leaving the least loaded replica
    balance_factor: float = 2.0  # the prefix holder is overloaded past this many times the least load ...
    balance_slack_tokens: int = 1024  # ... plus this many tokens (so idle replicas never count as overloaded)
    index_capacity_blocks: int = 65536  # per replica; its KV cache's block count is the natural size

    def __post_init__(self) -> None:
        if self.policy not in DP_ROUTING_POLICIES:
            raise ValueError(f"dp_routing must be one of {', '.join(DP_ROUTING_POLICIES)}; got {self.policy!r}")
        if self.balance_factor < 1.0:
            raise ValueError(f"balance_factor must be >= 1; got {self.balance_factor}")


@dataclass
class _Routed:
    """One open request as its replica's load counts it."""

    replica: int
    prompt_left: int  # prompt tokens still to compute (0 once its first output came)
    generation_left: int  # tokens it may still generate, over all its samples


class DataParallelRouter:
    """Chooses a replica per request and keeps each replica's outstanding-token load."""

    def __init__(self, num_replicas: int, settings: RouterSettings) -> None:
        if num_replicas < 1:
            raise ValueError(f"a router needs at least one replica; got {num_replicas}")
        self.settings = settings
        self.num_replicas = num_replicas
        self.load = [0] * num_replicas
        self.indexes = [PrefixIndex(settings.index_capacity_blocks) for _ in range(num_replicas)]
        self._open: dict[str, _Routed] = {}
        self._next = 0  # where the next tie-break (and round robin) starts

    def route(self, request_ids: list[str], prompts: list[list[int] | None], max_tokens: int | None,
              n: int = 1) -> int:
        """Picks the replica for one request (all its prompts go together) and counts it there.

        ``prompts``: each prompt's token ids, or None where the server did not tokenize it (it then
        counts as empty and matches no prefix)."""
        if len(request_ids) != len(prompts):
            raise ValueError(f"{len(request_ids)} request ids for {len(prompts)} prompts")
        hashes = [block_hashes(p, self.settings.block_size) if p else [] for p in prompts]
        replica = self._choose(hashes[0] if hashes else [])
        self._next = (replica + 1) % self.num_replicas
        block_size = self.settings.block_size
        for request_id, prompt, prompt_hashes in zip(request_ids, prompts, hashes):
            length = len(prompt or ())
            cached = min(self.indexes[replica].match(prompt_hashes) * block_size, max(length - 1, 0))
            limit = max_tokens if max_tokens is not None else max(self.settings.max_model_len - length, 0)
            routed = _Routed(replica, length - cached, n * limit)
            self._open[request_id] = routed
            self.load[replica] += routed.prompt_left + routed.generation_left
            self.indexes[replica].insert(prompt_hashes)
        return replica

    def replica_of(self, request_id: str) -> int | None:
        """The replica an open request went to (None once it ended or if it never was routed)."""
        routed = self._open.get(request_id)
        return routed.replica if routed is not None else None

    def on_output(self, request_id: str, num_new_tokens: int) -> None:
        """A request's output arrived: its prefill is done and it generated ``num_new_tokens`` more."""
        routed = self._open.get(request_id)
        if routed is None:
            return
        done = routed.prompt_left + min(num_new_tokens, routed.generation_left)
        routed.prompt_left = 0
        routed.generation_left -= min(num_new_tokens, routed.generation_left)
        self.load[routed.replica] -= done

    def release(self, request_id: str) -> None:
        """The request ended (finished, aborted, failed, refused): its replica owes it nothing more."""
        routed = self._open.pop(request_id, None)
        if routed is not None:
            self.load[routed.replica] -= routed.prompt_left + routed.generation_left

    @property
    def num_open(self) -> int:
        return len(self._open)

    def _in_turn(self) -> list[int]:
        """Replica indexes starting at the one whose turn it is (ties go to the first)."""
        return [(self._next + i) % self.num_replicas for i in range(self.num_replicas)]

    def _choose(self, hashes: list[int]) -> int:
        order = self._in_turn()
        if self.settings.policy == "round_robin":
            return order[0]
        least = min(order, key=lambda r: self.load[r])
        if self.settings.policy == "least_loaded" or not hashes:
            return least
        matched = {r: self.indexes[r].match(hashes) for r in order}
        best = max(order, key=lambda r: (matched[r], -self.load[r]))
        s = self.settings
        long_enough = matched[best] * s.block_size >= s.min_match_tokens
        overloaded = self.load[best] > s.balance_factor * self.load[least] + s.balance_slack_tokens
        return best if long_enough and not overloaded else least
