"""Model names to local paths: a file or folder as given, or a Hugging Face hub id through its cache.

A hub id (``org/name``) is looked up in the local Hugging Face cache first; only when it is not there
and the network is allowed (``HF_HUB_OFFLINE`` unset) are its config, tokenizer and safetensors files
downloaded. A repository holding one GGUF file and no config.json resolves to that file.
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re

from folovllm.config import EngineConfig

logger = logging.getLogger(__name__)

# What a model needs; other weight formats (.bin, .pt, several GGUF quantizations) are not fetched.
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_TRUE = ("1", "ON", "YES", "TRUE")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (also when set after it was imported)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def resolve_model_path(name: str, revision: str | None = None, cache_dir: str | None = None,
                       what: str = "model") -> str:
    """A local path for ``name``: itself when it exists, else the hub id's snapshot folder (or its
    single GGUF file); ValueError when it is neither a path nor available from the hub."""
    if os.path.exists(name):
        return name
    if not _REPO_ID.fullmatch(name) or name.endswith(".gguf"):
        raise ValueError(f"{what} {name!r} is not an existing file or folder, nor a Hugging Face hub id "
                         "(org/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(name, revision=revision, cache_dir=cache_dir, local_files_only=True)
    except LocalEntryNotFoundError:
        if hub_offline():
            raise ValueError(f"{what} {name!r} is not in the Hugging Face cache ({_cache_text(cache_dir)}) and "
                             "HF_HUB_OFFLINE is set: download it where the network is reachable "
                             f"(`huggingface-cli download {name}`) or give a local path") from None
        logger.info("%s %s is not cached: downloading it from the Hugging Face hub", what, name)
        try:
            folder = snapshot_download(name, revision=revision, cache_dir=cache_dir,
                                       allow_patterns=_DOWNLOAD_PATTERNS)
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
            raise ValueError(f"{what} {name!r} is not in the Hugging Face cache ({_cache_text(cache_dir)}) and "
                             f"downloading it failed: {err}") from None
    if not os.path.isfile(os.path.join(folder, "config.json")):
        ggufs = sorted(glob.glob(os.path.join(folder, "*.gguf")))
        if len(ggufs) == 1:
            return ggufs[0]
    return folder


def _cache_text(cache_dir: str | None) -> str:
    if cache_dir is not None:
        return cache_dir
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def resolve_model_files(config: EngineConfig) -> EngineConfig:
    """``config`` with ``model`` and ``tokenizer`` as local paths (hub ids looked up or downloaded)."""
    changes = {}
    for name in ("model", "tokenizer"):
        value = getattr(config, name)
        if value is not None:
            revision = config.revision if name == "model" else None  # --revision names the model's
            path = resolve_model_path(value, revision, config.download_dir, what=name)
            if path != value:
                changes[name] = path
    return dataclasses.replace(config, **changes) if changes else config
