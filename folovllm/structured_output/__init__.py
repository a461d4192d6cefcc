"""Structured outputs (grammar-constrained decoding): constraints compile to grammars off the
engine's path (cache.py), a backend per library (backend.py, xgrammar_backend.py), and the
engine's seam (manager.py): wait for the grammar, mask each step's logits, follow the tokens."""
from folovllm.structured_output.backend import (
                                                STRUCTURED_OUTPUT_BACKENDS,
                                                StructuredOutputBackend,
                                                make_backend,
                                                resolve_backend_name,
)
from folovllm.structured_output.cache import GrammarCache, spec_key
from folovllm.structured_output.manager import RequestGrammar, StructuredOutputManager

__all__ = ["GrammarCache", "RequestGrammar", "STRUCTURED_OUTPUT_BACKENDS", "StructuredOutputBackend",
           "StructuredOutputManager", "make_backend", "resolve_backend_name", "spec_key"]
