"""Compiled grammars by constraint: each distinct spec compiles once, on a thread pool, off the
caller's path; later requests with the same spec share the result (or the error)."""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from folovllm.sampling_params import StructuredOutputsParams
from folovllm.structured_output.backend import StructuredOutputBackend, make_backend

__all__ = ["GrammarCache", "spec_key"]


def spec_key(spec: StructuredOutputsParams) -> str:
    """The cache key: the constraint's kind and canonical text (a schema as a dict or its text,
    with keys in any order, is one key)."""
    value: Any = getattr(spec, spec.kind)
    if spec.kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass  # kept as text: compiling it reports the error
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return f"{spec.kind}|{int(spec.disable_any_whitespace)}|{text}"


class GrammarCache:
    """``get(spec)`` returns a future of the compiled grammar; the backend is built on first use
    (xgrammar loads only when some request asks for structured outputs).

    Holds at most ``max_entries`` specs, dropping the least recently used: a client cannot grow it
    without bound. ``num_compiles`` counts compilations actually run (cache misses).
    """

    def __init__(self, backend_name: str, tokenizer: Any, vocab_size: int | None,
                 eos_token_ids: Sequence[int], max_entries: int = 256, max_workers: int = 2) -> None:
        self._backend_args = (backend_name, tokenizer, vocab_size, list(eos_token_ids))
        self._backend: StructuredOutputBackend | None = None
        self._lock = threading.Lock()
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self.max_entries = max_entries
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="folovllm-grammar")
        self.num_compiles = 0
        self.num_hits = 0

    @property
    def backend(self) -> StructuredOutputBackend:
        """The backend, built on first use (thread-safe)."""
        return self.load()

    def load(self) -> StructuredOutputBackend:
        """Builds the backend now if it is not built yet (it reads the tokenizer's vocabulary)."""
        with self._lock:
            if self._backend is None:
                self._backend = make_backend(*self._backend_args)
            return self._backend

    def get(self, spec: StructuredOutputsParams) -> Future:
        """The compiled grammar of ``spec``, as a future that fails with ValueError for a bad spec."""
        key = spec_key(spec)
        with self._lock:
            future = self._futures.get(key)
            if future is not None:
                self._futures.move_to_end(key)
                self.num_hits += 1
                return future
            future = self._pool.submit(self._compile, spec)
            self._futures[key] = future
            self.num_compiles += 1
            while len(self._futures) > self.max_entries:
                self._futures.popitem(last=False)
        return future

    def _compile(self, spec: StructuredOutputsParams) -> Any:
        return self.backend.compile(spec)

    def close(self) -> None:
        """Stops the compile threads (compilations not started are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
