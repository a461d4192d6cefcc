"""Token ids → streamed text, a few tokens at a time, and stop-string matching on that text.

The detokenizer decodes only a short window of recent tokens per step (vLLM's prefix/read
offsets): the window starts with tokens already emitted, which give the context (leading
spaces, merges), followed by the tokens not yet read. Text that ends in an incomplete
UTF-8 character (decoded as U+FFFD) is held back until a later token completes it.
"""
from __future__ import annotations

from typing import Any

_REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as context for the first output tokens (leading-space handling).
_PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Streams the text of one sequence's output tokens.

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
        self.output_token_ids: list[int] = []

        context = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        context_text = self._decode(context)
        if context_text.endswith(_REPLACEMENT_CHAR):
            # A prompt cut mid-character would glue its bytes onto the first output token.
            context, context_text = [], ""
        # The decode window: tokens already emitted (kept as context), then unread tokens.
        self._window = context
        self._num_read = len(context)
        self._read_text = context_text  # decode(_window[:_num_read])

    def append(self, token_id: int) -> str:
        """Add one output token; return the text it finalizes (possibly ``""``)."""
        self.output_token_ids.append(token_id)
        self._window.append(token_id)
        window_text = self._decode(self._window)
        if window_text.endswith(_REPLACEMENT_CHAR):
            return ""  # an incomplete character: wait for the token that completes it
        return self._emit(window_text)

    def finish(self) -> str:
        """Flush held-back text (e.g. a trailing invalid/incomplete UTF-8 sequence, as U+FFFD)."""
        return self._emit(self._decode(self._window))

    def _emit(self, window_text: str) -> str:
        if len(window_text) <= len(self._read_text):
            return ""  # e.g. a skipped special token: nothing new to show
        delta = window_text[len(self._read_text) :]
        self.text += delta
        # The tokens just read become the context of the next window; older ones are dropped.
        del self._window[: self._num_read]
        self._num_read = len(self._window)
        self._read_text = self._decode(self._window)
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
