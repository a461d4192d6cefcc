"""load_tokenizer: the transformers tokenizer (with chat template) that belongs to a model path."""
from __future__ import annotations

import logging
import os

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from folovllm.model.gguf_loader import open_gguf
from folovllm.model.loader import default_model_path

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model: str) -> PreTrainedTokenizerBase:
    """Tokenizer for a .gguf file, a HF folder, or (no tokenizer files: dummy) the default model's."""
    if model.endswith(".gguf"):
        return _gguf_tokenizer(model)
    folder = model if os.path.isdir(model) else os.path.dirname(model)
    if os.path.isdir(folder) and any(os.path.exists(os.path.join(folder, f)) for f in _TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    logger.warning("no tokenizer files next to %r; using the default model's tokenizer", model)
    return _gguf_tokenizer(default_model_path())


def _gguf_tokenizer(path: str) -> PreTrainedTokenizerBase:
    if not os.path.isfile(path):
        raise ValueError(f"model file {path!r} does not exist (models are never downloaded)")
    folder, filename = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        field = open_gguf(path).fields.get("tokenizer.chat_template")
        if field is not None:
            tokenizer.chat_template = field.contents()
    return tokenizer
