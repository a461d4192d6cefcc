"""Rendering a conversation through a chat template: the server's ``--chat-template`` or the
tokenizer's, with tools, documents and template variables (transformers' sandboxed Jinja)."""
from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

# apply_chat_template's own arguments: a request sets them through their own fields, never as
# template variables.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})
_JINJA_CHARS = "{}\n"


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file's text, or the value itself when it is a template (it holds
    ``{``, ``}`` or a newline; backslash escapes such as ``\\n`` are read as in Python strings)."""
    if value is None:
        return None
    try:
        return Path(value).read_text()
    except OSError as err:
        if not any(c in value for c in _JINJA_CHARS):
            raise ValueError(f"--chat-template {value!r} looks like a file path, but it cannot be read "
                             f"({err.strerror or err}); give a readable file or the template itself") from err
    # latin-1 with backslashreplace keeps non-ASCII text intact through the escape decoding
    return codecs.decode(value.encode("latin-1", "backslashreplace"), "unicode_escape")


def render_chat_text(tokenizer: Any, conversation: list[dict], *, chat_template: str | None = None,
                     tools: list[dict] | None = None, documents: list[dict] | None = None,
                     add_generation_prompt: bool = True, continue_final_message: bool = False,
                     template_kwargs: dict[str, Any] | None = None) -> str:
    """The conversation as the prompt text; a template that fails raises its own exception."""
    return tokenizer.apply_chat_template(
        conversation, tools=tools, documents=documents, chat_template=chat_template, tokenize=False,
        add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
        **(template_kwargs or {}))
