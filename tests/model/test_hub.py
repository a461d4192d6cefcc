"""Model names to local paths: paths as given, hub ids from the local cache, a clear error offline."""
from __future__ import annotations

import pytest

from folovllm.config import EngineConfig
from folovllm.model.loader.hub import resolve_model_files, resolve_model_path
from tests.tiny_hub import TINY_REPO_ID, make_hub_cache


def test_a_local_path_is_itself(tmp_path) -> None:
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_a_hub_id_resolves_from_the_cache_without_network(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text("{}")
    snapshot = make_hub_cache(tmp_path / "hub", TINY_REPO_ID, source)
    assert resolve_model_path(TINY_REPO_ID, cache_dir=str(tmp_path / "hub")) == str(snapshot)
    config = resolve_model_files(EngineConfig(model=TINY_REPO_ID, tokenizer=TINY_REPO_ID,
                                              download_dir=str(tmp_path / "hub")))
    assert config.model == config.tokenizer == str(snapshot)


def test_a_gguf_only_repository_resolves_to_its_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = tmp_path / "source"
    source.mkdir()
    (source / "model.Q4_0.gguf").write_bytes(b"")
    snapshot = make_hub_cache(tmp_path / "hub", "org/gguf-only", source)
    assert resolve_model_path("org/gguf-only", cache_dir=str(tmp_path / "hub")) == str(snapshot / "model.Q4_0.gguf")


def test_not_cached_and_offline_is_an_error_that_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        resolve_model_path("org/absent", cache_dir=str(tmp_path))


def test_neither_a_path_nor_a_hub_id(tmp_path) -> None:
    with pytest.raises(ValueError, match="not an existing file or folder, nor a Hugging Face hub id"):
        resolve_model_path(str(tmp_path / "missing.gguf"))
