"""Per-request generation settings, with vLLM's field names."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from folovllm.beam_search import BeamSearchParams  # re-exported: vLLM's users import it from here

__all__ = ["BeamSearchParams", "SamplingParams", "StructuredOutputsParams"]

_INT64 = (-(2**63), 2**63 - 1)  # seeds and token ids are 64-bit integers (OpenAI's seed is int64)
STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """A constraint on what a request may generate; exactly one field is set (vLLM's names).

    ``json`` is a JSON schema (a dict or its text); ``json_object`` any JSON object; ``regex`` a
    regular expression; ``choice`` one of the given strings; ``grammar`` an EBNF (GBNF) grammar;
    ``structural_tag`` a structural-tag description in JSON text. ``disable_any_whitespace``: JSON
    is generated compactly (no free whitespace between tokens), which keeps small models from
    filling their budget with blank lines.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        chosen = [k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) not in (None, False)]
        if len(chosen) != 1:
            raise ValueError("structured outputs take exactly one of json, regex, choice, grammar, "
                             f"json_object or structural_tag; got {chosen or 'none'}.")
        if self.choice is not None and (not self.choice or any(not isinstance(c, str) for c in self.choice)):
            raise ValueError("structured outputs' choice must be a non-empty list of strings.")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError("structured outputs' json must be a JSON schema: a dict or its JSON text.")
        for name in ("regex", "grammar", "structural_tag"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"structured outputs' {name} must be a string.")

    @property
    def kind(self) -> str:
        """The name of the one field that is set."""
        return next(k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) not in (None, False))


@dataclass
class SamplingParams:
    """How to sample one request. Field names and defaults follow vLLM's ``SamplingParams``."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 means "all tokens"
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    # None: off. k >= 0: each prompt token after the first gets its logprob, its rank and the top-k.
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True  # False: token ids only, no text (benchmarks, foreign vocabularies)
    # vLLM's RequestOutputKind: "cumulative" = an output every step; "final_only" = only when it ends
    # (LLM.generate sets it: building outputs nobody reads costs host time every step)
    output_kind: str = "cumulative"
    structured_outputs: StructuredOutputsParams | None = None  # constrains the output (grammar)
    # Added to the logits of these token ids before sampling; -100 all but bans a token, +100 all but forces it.
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None  # only these may be sampled (a non-empty list)
    # Words never to complete: a word's last token is banned once its earlier tokens were just generated.
    bad_words: list[str] | None = None
    # Keep only the prompt's last k tokens; -1 means the model's max_model_len.
    truncate_prompt_tokens: int | None = None
    # Settings for parts other than sampling, by name (vLLM's): "kv_transfer_params" (PD disaggregation)
    extra_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        self._validate()
        self._validate_token_constraints()

    def _validate(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}.")

        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(name, "a finite number")
        for name in ("n", "top_k", "min_tokens"):
            if not _is_int(getattr(self, name)):
                raise bad(name, "an integer")
        for name in ("max_tokens", "logprobs", "prompt_logprobs", "seed"):
            if getattr(self, name) is not None and not _is_int(getattr(self, name)):
                raise bad(name, "an integer or None")
        if self.n < 1:
            raise bad("n", "an integer >= 1")
        if self.temperature < 0.0:
            raise bad("temperature", "non-negative (0 means greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise bad("top_k", "-1 (disabled) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", "at least 1")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise bad("min_tokens", "in [0, max_tokens]")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", "in [0, 20]")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise bad("prompt_logprobs", "in [0, 20] (or None for no prompt logprobs)")
        if self.seed is not None and not _INT64[0] <= self.seed <= _INT64[1]:
            raise bad("seed", "a 64-bit signed integer")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise bad("repetition_penalty", "in (0, 2]")
        if any(not isinstance(s, str) for s in self.stop):
            raise ValueError("stop must be a string or a list of strings.")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty.")
        bad_ids = [t for t in self.stop_token_ids if not _is_int(t) or t < 0 or t > _INT64[1]]
        if bad_ids:
            raise ValueError(f"stop_token_ids must be non-negative token ids, got {bad_ids[0]!r}.")
        if self.output_kind not in ("cumulative", "final_only"):
            raise bad("output_kind", "'cumulative' or 'final_only'")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise bad("extra_args", "a dict or None")
        kv_params = (self.extra_args or {}).get("kv_transfer_params")
        if kv_params is not None and not isinstance(kv_params, dict):
            raise ValueError(f"kv_transfer_params must be a JSON object, got {type(kv_params).__name__}.")
        if kv_params and self.n != 1:
            raise ValueError(f"kv_transfer_params (PD disaggregation) needs n=1, got n={self.n}.")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (they match text); "
                             "use stop_token_ids with detokenize=False.")

    def _validate_token_constraints(self) -> None:
        """logit_bias, allowed_token_ids, bad_words, truncate_prompt_tokens (vocabulary bounds are
        the engine's: it knows the model)."""
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias must be a dict of token id -> bias, "
                                 f"got {type(self.logit_bias).__name__}.")
            bad_ids = [t for t in self.logit_bias if not _is_token_id(t)]
            if bad_ids:
                raise ValueError(f"logit_bias must be keyed by non-negative token ids, got {bad_ids[:5]!r}.")
            bad_biases = [b for b in self.logit_bias.values()
                          if isinstance(b, bool) or not isinstance(b, (int, float))
                          or not -100.0 <= b <= 100.0]
            if bad_biases:
                raise ValueError(f"logit_bias must be biases in [-100, 100], got {bad_biases[:5]!r}.")
        if self.allowed_token_ids is not None:
            if not isinstance(self.allowed_token_ids, (list, tuple)) or not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must be a non-empty list of token ids (or None for "
                                 f"no restriction), got {self.allowed_token_ids!r}.")
            bad_ids = [t for t in self.allowed_token_ids if not _is_token_id(t)]
            if bad_ids:
                raise ValueError(f"allowed_token_ids must be non-negative token ids, got {bad_ids[:5]!r}.")
            self.allowed_token_ids = list(dict.fromkeys(self.allowed_token_ids))
        if any(not isinstance(w, str) or not w for w in self.bad_words):
            raise ValueError("bad_words must be a list of non-empty strings.")
        self.bad_words = list(dict.fromkeys(self.bad_words))
        k = self.truncate_prompt_tokens
        if k is not None and (not _is_int(k) or not (k == -1 or k >= 1)):
            raise ValueError("truncate_prompt_tokens must be -1 (the model's max_model_len) or an integer "
                             f">= 1, got {k!r}.")

    @property
    def greedy(self) -> bool:
        """Temperature (near) zero: the argmax token, no randomness."""
        return self.temperature < 1e-5

    @property
    def has_penalties(self) -> bool:
        """Some penalty reads the request's earlier tokens."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_id(value: object) -> bool:
    return _is_int(value) and 0 <= value <= _INT64[1]
