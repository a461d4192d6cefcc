"""load_tokenizer: the transformers tokenizer (with chat template) that belongs to a model path.

A GGUF file's tokenizer is converted by transformers from the file's metadata, which means parsing
every vocabulary and merge entry (seconds of CPU on the default model). The converted tokenizer is
kept on disk, under ``$FOLOVLLM_CACHE_ROOT/tokenizers`` (default ``~/.cache/folovllm``), keyed by the
file's path, size and modification time and the transformers version, and later starts load it from
there. ``FOLOVLLM_TOKENIZER_CACHE=off`` converts it every time.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile

import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from folovllm import envs
from folovllm.model.loader.loader import default_model_path, gguf_reader

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TOKENIZER_CACHE_ENV = "FOLOVLLM_TOKENIZER_CACHE"
_COMPLETE = "folovllm-complete"  # written last: a folder without it is an interrupted save


def load_tokenizer(model: str) -> PreTrainedTokenizerBase:
    """Tokenizer for a .gguf file, a HF folder, or (no tokenizer files: dummy) the default model's."""
    if model.endswith(".gguf"):
        return _gguf_tokenizer(model)
    folder = model if os.path.isdir(model) else os.path.dirname(model)
    if os.path.isdir(folder) and any(os.path.exists(os.path.join(folder, f)) for f in _TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    logger.warning("no tokenizer files next to %r; using the default model's tokenizer", model)
    return _gguf_tokenizer(default_model_path())


def cache_root() -> str:
    """Where FoloVLLM keeps what it derives from models (``$FOLOVLLM_CACHE_ROOT``)."""
    default = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "folovllm")
    return envs.value("FOLOVLLM_CACHE_ROOT") or default


def gguf_tokenizer_cache_dir(path: str) -> str:
    """The cache folder of ``path``'s converted tokenizer (a new one whenever the file changes)."""
    stat = os.stat(path)
    key = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return os.path.join(cache_root(), "tokenizers", hashlib.sha256(key.encode()).hexdigest()[:24])


def _gguf_tokenizer(path: str) -> PreTrainedTokenizerBase:
    if not os.path.isfile(path):
        raise ValueError(f"model file {path!r} does not exist (models are never downloaded)")
    cached = gguf_tokenizer_cache_dir(path) if envs.switch(TOKENIZER_CACHE_ENV) else None
    if cached is not None and os.path.exists(os.path.join(cached, _COMPLETE)):
        return AutoTokenizer.from_pretrained(cached, local_files_only=True)
    folder, filename = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        field = gguf_reader().open_gguf(path).fields.get("tokenizer.chat_template")
        if field is not None:
            tokenizer.chat_template = field.contents()
    if cached is not None:
        _save_to_cache(tokenizer, cached)
    return tokenizer


def _save_to_cache(tokenizer: PreTrainedTokenizerBase, folder: str) -> None:
    """Save into a fresh folder beside ``folder``, then rename it into place: a reader sees a whole
    tokenizer or none, and two processes converting at once both succeed. A cache that cannot be
    written (read-only home) only costs the conversion next time."""
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=".saving-", dir=os.path.dirname(folder))
        tokenizer.save_pretrained(scratch)
        open(os.path.join(scratch, _COMPLETE), "w").close()
        if os.path.isdir(folder) and not os.path.exists(os.path.join(folder, _COMPLETE)):
            shutil.rmtree(folder, ignore_errors=True)  # an interrupted save: replace it
        try:
            os.rename(scratch, folder)
        except OSError:  # another process got there first
            shutil.rmtree(scratch, ignore_errors=True)
    except OSError as exc:
        logger.warning("could not cache the converted tokenizer in %s: %s", folder, exc)
