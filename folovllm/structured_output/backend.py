"""The structured-output backend interface: a constraint compiles to a grammar; a matcher per
sequence follows the tokens it accepts and says which tokens may come next (a bitmask).

A backend is one class registered by name (``@STRUCTURED_OUTPUT_BACKENDS.register("name")``); the
name is ``EngineConfig.structured_outputs_backend`` and the ``--structured-outputs-backend`` choice.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from folovllm.registry import Registry
from folovllm.sampling_params import StructuredOutputsParams

__all__ = ["GrammarMatcher", "STRUCTURED_OUTPUT_BACKENDS", "StructuredOutputBackend", "make_backend",
           "resolve_backend_name"]


class GrammarMatcher(Protocol):
    """One sequence's position in its grammar."""

    def accept_token(self, token_id: int) -> bool:
        """Advances by one token; False (and no move) when the grammar does not allow it."""

    def is_terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted: nothing may follow."""

    def rollback(self, num_tokens: int) -> None:
        """Undoes the last ``num_tokens`` accepted tokens (speculative decoding's proposals)."""


class StructuredOutputBackend(ABC):
    """Compiles constraints for one tokenizer and fills token bitmasks for a batch of matchers.

    A bitmask row is ``ceil(vocab_size / 32)`` int32 words; bit ``t % 32`` of word ``t // 32`` set
    means token ``t`` is allowed. ``vocab_size`` is the model's logits width, which may exceed the
    tokenizer's: ids past the tokenizer's are never allowed.
    """

    def __init__(self, tokenizer: Any, vocab_size: int | None, eos_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size if vocab_size is not None else len(tokenizer)
        self.eos_token_ids = list(eos_token_ids)

    @property
    def bitmask_width(self) -> int:
        """int32 words per bitmask row."""
        return (self.vocab_size + 31) // 32

    @abstractmethod
    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of ``spec``; ValueError saying what is wrong with it. Thread-safe."""

    @abstractmethod
    def new_matcher(self, grammar: Any, stop_token_ids: Sequence[int]) -> GrammarMatcher:
        """A matcher at the grammar's start; once the grammar is complete only ``stop_token_ids``
        (the model's EOS when empty) may follow."""

    @abstractmethod
    def fill_bitmask(self, matchers: Sequence[GrammarMatcher], bitmask: np.ndarray) -> None:
        """Fills row ``i`` of the int32 ``[len(matchers), bitmask_width]`` array for matcher ``i``, in one pass."""


STRUCTURED_OUTPUT_BACKENDS: Registry[type[StructuredOutputBackend]] = Registry("structured outputs backend")


def _import_builtin_backends() -> None:
    # Imported on first use: xgrammar loads only once a request asks for structured outputs.
    from folovllm.structured_output import xgrammar_backend  # noqa: F401


def resolve_backend_name(name: str) -> str:
    """``auto`` is xgrammar; any other name must be registered (ValueError listing those that are)."""
    _import_builtin_backends()
    name = "xgrammar" if name == "auto" else name
    STRUCTURED_OUTPUT_BACKENDS.get(name)
    return name


def make_backend(name: str, tokenizer: Any, vocab_size: int | None,
                 eos_token_ids: Sequence[int]) -> StructuredOutputBackend:
    """The backend registered as ``name`` (or ``auto``) for this tokenizer and logits width."""
    return STRUCTURED_OUTPUT_BACKENDS.get(resolve_backend_name(name))(tokenizer, vocab_size, eos_token_ids)
