"""``speculative_config``: vLLM's keys, checked once; imports nothing from the package."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model")
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
         "disable_by_batch_size"}
# vLLM's other methods, named so that the error says what is missing rather than "unknown"
_NOT_IMPLEMENTED = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "suffix", "deepseek_mtp")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How requests speculate: ``method`` proposes up to ``num_speculative_tokens`` tokens per step."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 5  # ngram: the longest suffix matched against earlier tokens
    prompt_lookup_min: int = 5  # ngram: the shortest
    model: str | None = None  # draft_model: the draft's folder or hub id (same tokenizer as the target)
    disable_by_batch_size: int | None = None  # no proposals while more requests run (None: always propose)

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> SpeculativeConfig:
        """vLLM's dict; a ValueError naming any key or method that is not supported."""
        if not isinstance(spec, dict):
            raise ValueError(f"speculative_config must be a dict (JSON object); got {type(spec).__name__}")
        unknown = sorted(set(spec) - _KEYS)
        if unknown:
            raise ValueError(f"speculative_config: unsupported key(s) {unknown}; supported: {sorted(_KEYS)}")
        method = spec.get("method") or ("draft_model" if spec.get("model") else None)
        if method is None:
            raise ValueError("speculative_config needs 'method' (ngram) or 'model' (a draft model)")
        if method in _NOT_IMPLEMENTED:
            raise ValueError(f"speculative_config: method {method!r} is not implemented; use one of {METHODS}")
        if method not in METHODS:
            raise ValueError(f"speculative_config: unknown method {method!r}; use one of {METHODS}")
        if method == "draft_model" and not spec.get("model"):
            raise ValueError("speculative_config: method 'draft_model' needs 'model' (the draft's folder or hub id)")
        if method == "ngram" and spec.get("model"):
            raise ValueError("speculative_config: method 'ngram' takes no 'model'")
        k = spec.get("num_speculative_tokens")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"speculative_config: num_speculative_tokens must be an int >= 1; got {k!r}")
        low, high = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        if method != "ngram" and (low is not None or high is not None):
            raise ValueError("speculative_config: prompt_lookup_min/max apply to method 'ngram' only")
        low, high = (low or high or 5), (high or low or 5)  # vLLM: one given sets both
        if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
            raise ValueError(f"speculative_config: need 1 <= prompt_lookup_min <= prompt_lookup_max; "
                             f"got {low!r}, {high!r}")
        limit = spec.get("disable_by_batch_size")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"speculative_config: disable_by_batch_size must be an int >= 1; got {limit!r}")
        return cls(method, k, high, low, spec.get("model"), limit)
