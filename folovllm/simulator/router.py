"""Which replica a request goes to: round robin, least loaded, or the longest prefix-cache hit."""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from folovllm.registry import Registry
from folovllm.request import Request
from folovllm.simulator.engine import SimEngine

ROUTERS: Registry[type[Router]] = Registry("router")


class Router:
    """Picks a replica for each arriving request."""

    def pick(self, request: Request, replicas: Sequence[SimEngine]) -> SimEngine:
        raise NotImplementedError


@ROUTERS.register("round_robin")
class RoundRobinRouter(Router):
    def __init__(self) -> None:
        self._next = itertools.count()

    def pick(self, request: Request, replicas: Sequence[SimEngine]) -> SimEngine:
        return replicas[next(self._next) % len(replicas)]


@ROUTERS.register("least_loaded")
class LeastLoadedRouter(Router):
    """Fewest unfinished requests (waiting + running); ties to the lowest index."""

    def pick(self, request: Request, replicas: Sequence[SimEngine]) -> SimEngine:
        return min(replicas, key=lambda e: e.num_unfinished)


@ROUTERS.register("prefix_aware")
class PrefixAwareRouter(Router):
    """The replica whose prefix cache holds the most of the prompt; among equals, the least loaded.

    A replica whose load exceeds the least loaded one's by ``max_imbalance`` requests is passed over,
    so one hot prefix cannot pile every request on one replica."""

    def __init__(self, max_imbalance: int = 32) -> None:
        self.max_imbalance = max_imbalance

    def pick(self, request: Request, replicas: Sequence[SimEngine]) -> SimEngine:
        least = min(e.num_unfinished for e in replicas)
        candidates = [e for e in replicas if e.num_unfinished <= least + self.max_imbalance]
        return max(candidates, key=lambda e: (len(e.kv_cache.find_cached_prefix(request)), -e.num_unfinished))


def make_router(name: str) -> Router:
    """The router registered as ``name``; ValueError listing the known names otherwise."""
    return ROUTERS.get(name)()
