"""Request bodies of the pooling endpoints: /v1/embeddings (OpenAI's), /pooling, /score and /rerank (vLLM's,
Jina's and Cohere's shapes). A field not listed here is a 400 naming it: none is silently ignored."""
from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from folovllm.entrypoints.openai.protocol import Bool, Int, TokenIds, _Body

# A string, several strings, one token-id list, or several (OpenAI's ``input``).
PoolingInput = str | list[str] | TokenIds | list[TokenIds]


class _PoolingBody(_Body):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: Int | None = None
    priority: Int = 0


class EmbeddingRequest(_PoolingBody):
    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int | None = None
    normalize: Bool | None = None  # vLLM's: None is the model's default (normalized)
    add_special_tokens: Bool = True


class PoolingRequest(EmbeddingRequest):
    """/pooling: the pooled hidden states as they are (one row per token for pooling type ALL)."""


class ScoreRequest(_PoolingBody):
    text_1: str | list[str] = Field(min_length=1)
    text_2: str | list[str] = Field(min_length=1)


class RerankRequest(_PoolingBody):
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: Int | None = Field(default=None, ge=0)  # None or 0: every document
    return_documents: Bool = True
