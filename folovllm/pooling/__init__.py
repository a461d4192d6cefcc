"""Pooling: a prompt's final hidden states as one result (an embedding, a score) instead of a next token.

``config.py`` decides the pooling type and normalization (``--pooler-config``, a sentence-transformers
folder, or the defaults); ``pooler.py`` runs on the worker after the forward, pooling each request over
all of its prefill chunks; ``score.py`` pairs texts and scores them from their embeddings.
"""
from folovllm.pooling.config import POOLING_TYPES, PoolerConfig, pooler_config_for
from folovllm.pooling.pooler import Pooler, PoolingChunk, PoolingRow

__all__ = ["POOLING_TYPES", "Pooler", "PoolerConfig", "PoolingChunk", "PoolingRow", "pooler_config_for"]
