"""Prompt forms ``LLM.generate`` takes besides a plain string, with vLLM's names.

They are plain dicts (TypedDicts), so ``{"prompt_token_ids": [...]}`` written by hand works the same.
"""
from __future__ import annotations

from typing import NotRequired, TypedDict


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""

    prompt: str
    cache_salt: NotRequired[str]  # keeps this request's prefix-cache blocks apart from other salts


class TokensPrompt(TypedDict):
    """A prompt given as token ids (no tokenization); ``prompt`` is only echoed back in the output."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    cache_salt: NotRequired[str]


PromptType = str | TextPrompt | TokensPrompt | list[int]

__all__ = ["PromptType", "TextPrompt", "TokensPrompt"]
