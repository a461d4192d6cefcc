"""The engine's one seam to structured outputs: a constrained request waits for its grammar, each
step its rows get the token bitmask, and its matcher follows every token it accepts.

Matchers live with the engine's ``Request`` (one per sequence, so ``n > 1`` samples each have
theirs) and see only tokens the engine has accepted, so a preempted request that recomputes its
KV keeps its matcher as it is.
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from folovllm.request import Request
from folovllm.structured_output.backend import GrammarMatcher
from folovllm.structured_output.cache import GrammarCache

__all__ = ["RequestGrammar", "StructuredOutputManager"]


class RequestGrammar:
    """One sequence's constraint: its grammar while compiling, then its matcher."""

    def __init__(self, future: Future) -> None:
        self.future = future
        self.matcher: GrammarMatcher | None = None

    @property
    def ready(self) -> bool:
        """The manager has built the matcher: the scheduler may admit the request."""
        return self.matcher is not None

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted."""
        return self.matcher is not None and self.matcher.is_terminated()


class StructuredOutputManager:
    """What the engine calls: ``add_request`` when a request arrives, ``update`` before scheduling,
    ``fill_bitmasks`` when building a step, ``accept`` for each sampled token."""

    def __init__(self, cache: GrammarCache) -> None:
        self.cache = cache
        self._compiling: list[Request] = []  # requests whose grammar is not ready yet

    def add_request(self, request: Request) -> None:
        """Starts (or reuses) the compilation of the request's constraint; no-op when it has none."""
        spec = request.params.structured_outputs
        if spec is not None:
            self.cache.load()  # on the caller's thread: it reads the tokenizer the caller also uses
            request.grammar = RequestGrammar(self.cache.get(spec))
            self._compiling.append(request)

    @property
    def has_compiling(self) -> bool:
        return bool(self._compiling)

    def update(self) -> list[tuple[Request, str]]:
        """Makes requests whose grammar compiled ready (each gets its matcher); returns those whose
        compilation failed, with the reason. Finished (aborted) requests are dropped."""
        failed, still = [], []
        for request in self._compiling:
            grammar: RequestGrammar = request.grammar
            if request.status.finished:
                continue
            if not grammar.future.done():
                still.append(request)
                continue
            error = grammar.future.exception()
            if error is not None:
                failed.append((request, str(error)))
                continue
            grammar.matcher = self.cache.backend.new_matcher(grammar.future.result(), request.stop_token_ids)
        self._compiling = still
        return failed

    def wait(self, timeout_s: float) -> None:
        """Blocks until some compiling grammar is done, or ``timeout_s`` (an idle engine's pause)."""
        futures = [r.grammar.future for r in self._compiling]
        if futures:
            concurrent.futures.wait(futures, timeout_s, return_when=concurrent.futures.FIRST_COMPLETED)

    def fill_bitmasks(self, requests: Sequence[Request]) -> list[np.ndarray | None]:
        """Each request's allowed next tokens as a bitmask row (None: unconstrained), filled for
        all constrained requests in one backend call."""
        constrained = [i for i, r in enumerate(requests) if r.grammar is not None]
        rows: list[np.ndarray | None] = [None] * len(requests)
        if not constrained:
            return rows
        backend = self.cache.backend
        bitmask = np.empty((len(constrained), backend.bitmask_width), dtype=np.int32)
        backend.fill_bitmask([requests[i].grammar.matcher for i in constrained], bitmask)
        for k, i in enumerate(constrained):
            rows[i] = bitmask[k]
        return rows

    def accept(self, request: Request, token_id: int) -> str | None:
        """Advances the request's matcher by its sampled token; the reason when it cannot."""
        grammar: Any = request.grammar
        if grammar is None or grammar.is_terminated:
            return None
        if not grammar.matcher.accept_token(token_id):
            return (f"token {token_id} does not fit the request's structured-outputs constraint "
                    "(a stop token was banned by min_tokens, or the constraint allows nothing here)")
        return None

    def fitting_prefix(self, request: Request, token_ids: Sequence[int]) -> list[int]:
        """The longest prefix of proposed tokens the request's grammar accepts; the matcher is left as it was."""
        matcher = request.grammar.matcher
        fitting = 0
        for token_id in token_ids:
            if matcher.is_terminated() or not matcher.accept_token(token_id):
                break
            fitting += 1
        if fitting:
            matcher.rollback(fitting)
        return list(token_ids[:fitting])

    def draft_bitmasks(self, request: Request, token_ids: Sequence[int]) -> list[np.ndarray]:
        """The allowed-token bitmask after each proposed token (which the grammar must accept); the
        matcher is left as it was."""
        matcher = request.grammar.matcher
        backend = self.cache.backend
        bitmask = np.empty((len(token_ids), backend.bitmask_width), dtype=np.int32)
        for row, token_id in enumerate(token_ids):
            if not matcher.accept_token(token_id):
                raise RuntimeError(f"proposed token {token_id} does not fit the grammar it was checked against")
            backend.fill_bitmask([matcher], bitmask[row:row + 1])
        matcher.rollback(len(token_ids))
        return list(bitmask)

