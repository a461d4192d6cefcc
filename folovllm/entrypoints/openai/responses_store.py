"""Stored responses (``store: true``): what ``previous_response_id``, ``GET /v1/responses/{id}`` and
``DELETE`` read, kept in this process's memory.

The policy, bounded in count and in age: at most ``max_count`` responses (``--max-stored-responses``),
each for ``ttl_s`` seconds after it was created (``--stored-response-ttl``); storing one more drops the
oldest. Reading a response does not extend its life. Each keeps its whole conversation (the input
items, its history's included, then its output), so a next turn needs no other response, and what one
holds is bounded by what fits the model's context. A restart forgets them all.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


def check_store_bounds(max_count: int, ttl_s: float) -> None:
    if max_count < 0 or not ttl_s > 0:
        raise ValueError(f"--max-stored-responses must be >= 0 and --stored-response-ttl > 0; got {max_count} "
                         f"and {ttl_s}")


@dataclass
class StoredResponse:
    response: dict  # the response object, as GET returns it
    items: list  # the conversation so far, as input items: a next turn's history
    created: float  # the store's clock when it was stored


class ResponseStore:
    """Responses by id, oldest first; expired ones are dropped as the store is used."""

    def __init__(self, max_count: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        check_store_bounds(max_count, ttl_s)
        self.max_count = max_count
        self.ttl_s = ttl_s
        self._clock = clock
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_count > 0

    def __len__(self) -> int:
        self._expire()
        return len(self._responses)

    def put(self, response_id: str, response: dict, items: list) -> None:
        if not self.enabled:
            raise ValueError("this server keeps no responses (--max-stored-responses 0)")
        self._expire()
        self._responses[response_id] = StoredResponse(response, items, self._clock())
        self._responses.move_to_end(response_id)
        while len(self._responses) > self.max_count:
            self._responses.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self._responses.get(response_id)

    def delete(self, response_id: str) -> bool:
        self._expire()
        return self._responses.pop(response_id, None) is not None

    def _expire(self) -> None:
        oldest = self._clock() - self.ttl_s
        while self._responses and next(iter(self._responses.values())).created <= oldest:
            self._responses.popitem(last=False)
