"""Token ids → streamed text, a few tokens at a time, and stop-string matching on that text.

Streaming is the ``tokenizers`` library's ``DecodeStream``: per token it decodes a short window of
recent tokens (the context gives leading spaces and merges) and holds back text that ends in an
incomplete UTF-8 character (U+FFFD) until a later token completes it.
"""
from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream

_REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as context for the first output tokens (leading-space handling).
_PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Streams the text of one sequence's output tokens (needs a fast tokenizer: one with a
    ``backend_tokenizer``, which is what ``load_tokenizer`` returns).

    Invariant: once :meth:`finish` has been called, the concatenation of everything returned
    by :meth:`append` and :meth:`finish` equals
    ``tokenizer.decode(output_ids, skip_special_tokens=...)`` for byte-level BPE tokenizers.
    (With SentencePiece the first output token keeps the leading space the prompt context
    implies, as vLLM does.) Call :meth:`finish` when the sequence ends: it flushes text held
    back because it ended in an incomplete UTF-8 character.
    """

    def __init__(
        self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        self._backend = tokenizer.backend_tokenizer
        context = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        if context and self._decode(context).endswith(_REPLACEMENT_CHAR):
            # A prompt cut mid-character would glue its bytes onto the first output token.
            context = []
        self._stream = DecodeStream(context, skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []  # output tokens whose text the stream holds back

    def append(self, token_id: int) -> str:
        """Add one output token; return the text it finalizes (possibly ``""``)."""
        delta = self._stream.step(self._backend, token_id)
        if delta is None:
            self._held.append(token_id)
            return ""  # an incomplete character (or nothing to show yet): wait for the next token
        if self._held:
            self._held.clear()
        self.text += delta
        return delta

    def finish(self) -> str:
        """Flush held-back text (e.g. a trailing invalid/incomplete UTF-8 sequence, as U+FFFD)."""
        delta = self._decode(self._held)
        self._held.clear()
        self.text += delta
        return delta

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)


def find_stop(
    text: str, new_text_len: int, stop: list[str], include_stop_str: bool = False
) -> int | None:
    """Where to cut ``text`` if a stop string overlaps its last ``new_text_len`` chars, else None.

    Returns the earliest match's start (or its end with ``include_stop_str``). Only matches
    that reach into the new text are considered: earlier text was checked on earlier steps.
    """
    best: tuple[int, int] | None = None  # (match start, cut position)
    for stop_str in stop:
        start = max(0, len(text) - new_text_len - len(stop_str) + 1)
        index = text.find(stop_str, start)
        if index == -1:
            continue
        match = (index, index + len(stop_str) if include_stop_str else index)
        if best is None or match < best:
            best = match
    return None if best is None else best[1]
