"""Backend pools and the routing policies that pick an instance from one.

A pool counts, per instance, the requests this proxy has in flight there; ``least_loaded`` reads
those counts (the proxy sees no other client's load), ``round_robin`` ignores them.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol

from folovllm.registry import Registry


@dataclass
class Backend:
    """One server: its base URL (no trailing slash, no /v1) and this proxy's requests in flight there."""

    url: str
    in_flight: int = 0


class RoutingPolicy(Protocol):
    def pick(self, backends: list[Backend]) -> Backend: ...


ROUTING_POLICIES: Registry[type[RoutingPolicy]] = Registry("routing policy")


@ROUTING_POLICIES.register("round_robin")
class RoundRobin:
    """Each instance in turn, whatever its load."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, backends: list[Backend]) -> Backend:
        chosen = backends[self._next % len(backends)]
        self._next += 1
        return chosen


@ROUTING_POLICIES.register("least_loaded")
class LeastLoaded:
    """The instance with the fewest requests in flight; ties go round in turn, so an idle pool
    spreads its first requests instead of piling them on the first instance."""

    def __init__(self) -> None:
        self._start = 0

    def pick(self, backends: list[Backend]) -> Backend:
        n = len(backends)
        order = [backends[(self._start + i) % n] for i in range(n)]
        self._start += 1
        return min(order, key=lambda b: b.in_flight)


def normalize_url(url: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` → ``http(s)://host:port``; ValueError otherwise."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    scheme, _, rest = url.partition("://")
    if scheme not in ("http", "https") or not rest:
        raise ValueError(f"a backend URL must look like http://HOST:PORT, got {url!r}.")
    if rest.endswith("/v1"):
        url = url[: -len("/v1")]  # the proxy appends the route's own /v1/... path
    return url


class BackendPool:
    """The instances of one role (prefill or decode) and the policy that picks among them."""

    def __init__(self, role: str, urls: list[str], policy: str) -> None:
        if not urls:
            raise ValueError(f"the {role} pool needs at least one URL.")
        self.role = role
        self.backends = [Backend(normalize_url(u)) for u in urls]
        self.policy = ROUTING_POLICIES.get(policy)()

    def pick(self) -> Backend:
        return self.policy.pick(self.backends)

    @contextmanager
    def lease(self, backend: Backend) -> Iterator[Backend]:
        """Counts a request in flight at ``backend`` until the block ends (however it ends)."""
        backend.in_flight += 1
        try:
            yield backend
        finally:
            backend.in_flight -= 1
