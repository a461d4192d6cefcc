"""Structured outputs on xgrammar: JSON schemas, regexes, choices, EBNF grammars, structural tags."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from folovllm.sampling_params import StructuredOutputsParams
from folovllm.structured_output.backend import STRUCTURED_OUTPUT_BACKENDS, GrammarMatcher, StructuredOutputBackend

# xgrammar's messages start with "[hh:mm:ss] /path/file.cc:123: " and sometimes a failed check.
_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


@STRUCTURED_OUTPUT_BACKENDS.register("xgrammar")
class XgrammarBackend(StructuredOutputBackend):
    """Grammars compiled by one ``xgr.GrammarCompiler`` for the model's tokenizer; bitmasks filled
    for the whole batch by ``xgr.BatchGrammarMatcher`` (its threads, one call)."""

    def __init__(self, tokenizer: Any, vocab_size: int | None, eos_token_ids: Sequence[int]) -> None:
        super().__init__(tokenizer, vocab_size, eos_token_ids)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=self.eos_token_ids or None)
        self.compiler = xgr.GrammarCompiler(info)
        self.batch = xgr.BatchGrammarMatcher()

    def compile(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        try:
            return self._compile(spec)
        except (RuntimeError, ValueError, TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"invalid {spec.kind} for structured outputs: {_clean(err)}") from None

    def _compile(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        compiler = self.compiler
        compact = spec.disable_any_whitespace
        if spec.json is not None:
            schema = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)
            return compiler.compile_json_schema(schema, any_whitespace=not compact)
        if spec.json_object:
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=not compact)
        if spec.regex is not None:
            return compiler.compile_regex(spec.regex)
        if spec.choice is not None:
            # JSON string literals are EBNF string literals: quotes, backslashes, control chars escaped.
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
            return compiler.compile_grammar(f"root ::= {alternatives}")
        if spec.grammar is not None:
            return compiler.compile_grammar(spec.grammar)
        return self._compile_structural_tag(spec.structural_tag)

    def _compile_structural_tag(self, text: str) -> xgr.CompiledGrammar:
        try:
            tag = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"structural_tag is not JSON: {err}") from None
        if isinstance(tag, dict) and "structures" in tag:  # OpenAI/vLLM form: begin, schema, end; triggers
            items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})),
                                           end=s["end"]) for s in tag["structures"]]
            return self.compiler.compile_structural_tag(items, list(tag.get("triggers", [])))
        return self.compiler.compile_structural_tag(text)

    def new_matcher(self, grammar: xgr.CompiledGrammar, stop_token_ids: Sequence[int]) -> GrammarMatcher:
        stop = list(stop_token_ids) or self.eos_token_ids
        return xgr.GrammarMatcher(grammar, override_stop_tokens=stop or None)

    def fill_bitmask(self, matchers: Sequence[GrammarMatcher], bitmask: np.ndarray) -> None:
        self.batch.batch_fill_next_token_bitmask(list(matchers), torch.from_numpy(bitmask))


def _clean(err: Exception) -> str:
    """xgrammar's message without its source location; the first line only."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return _LOCATION.sub("", lines[0]) if lines else type(err).__name__
