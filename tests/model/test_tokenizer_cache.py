"""The GGUF tokenizer's disk cache: a cached tokenizer is the converted one, keyed by the file."""
from __future__ import annotations

import logging
import os
import shutil

import pytest

from folovllm.model.loader import default_model_path
from folovllm.model.loader.tokenizer import (
    _COMPLETE,
    _save_to_cache,
    gguf_tokenizer_cache_dir,
    load_tokenizer,
)

TEXTS = ["Hello wörld!", "<|im_start|>user\n  tabs\tand 12345", "emoji 🤖 and \u00a0nbsp", "", "  leading spaces"]


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("folovllm-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FOLOVLLM_CACHE_ROOT", str(root))
        mp.setenv("FOLOVLLM_TOKENIZER_CACHE", "on")
        yield root


@pytest.fixture(scope="module")
def converted_and_cached(cache_root):
    converted = load_tokenizer(default_model_path())  # converts from the GGUF and saves
    cached = load_tokenizer(default_model_path())  # loads the saved one
    return converted, cached


def test_second_load_comes_from_the_cache(cache_root, converted_and_cached):
    folder = gguf_tokenizer_cache_dir(default_model_path())
    assert folder.startswith(str(cache_root))
    assert os.path.exists(os.path.join(folder, _COMPLETE))
    converted, cached = converted_and_cached
    assert os.path.samefile(cached.name_or_path, folder)
    assert not os.path.samefile(os.path.dirname(default_model_path()), folder)


def test_cached_tokenizer_equals_the_converted_one(converted_and_cached):
    converted, cached = converted_and_cached
    assert type(cached) is type(converted)
    assert cached.get_vocab() == converted.get_vocab()
    assert cached.all_special_ids == converted.all_special_ids
    assert (cached.bos_token_id, cached.eos_token_id, cached.pad_token_id) == \
        (converted.bos_token_id, converted.eos_token_id, converted.pad_token_id)
    for text in TEXTS:
        ids = converted.encode(text)
        assert cached.encode(text) == ids
        assert cached.decode(ids) == converted.decode(ids)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert cached.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        converted.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_key_changes_with_the_file(tmp_path, cache_root):
    copy = tmp_path / "m.gguf"
    shutil.copyfile(default_model_path(), copy)
    before = gguf_tokenizer_cache_dir(str(copy))
    os.utime(copy, ns=(1, 1))
    assert gguf_tokenizer_cache_dir(str(copy)) != before
    assert gguf_tokenizer_cache_dir(str(copy)) != gguf_tokenizer_cache_dir(default_model_path())


def test_interrupted_save_is_replaced(tmp_path, converted_and_cached):
    converted, _ = converted_and_cached
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{truncated")
    _save_to_cache(converted, str(folder))
    assert (folder / _COMPLETE).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]  # no scratch folder left behind


def test_unwritable_cache_only_warns(tmp_path, converted_and_cached, caplog):
    converted, _ = converted_and_cached
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        _save_to_cache(converted, str(blocker / "tokenizers" / "x"))
    assert "could not cache the converted tokenizer" in caplog.text


def test_switch_off_and_bad_values(monkeypatch, tmp_path):
    monkeypatch.setenv("FOLOVLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("FOLOVLLM_TOKENIZER_CACHE", "maybe")
    with pytest.raises(ValueError, match="FOLOVLLM_TOKENIZER_CACHE='maybe'; choose one of on, off"):
        load_tokenizer(default_model_path())
    monkeypatch.setenv("FOLOVLLM_TOKENIZER_CACHE", "off")
    tokenizer = load_tokenizer(default_model_path())
    assert tokenizer.eos_token_id is not None
    assert not (tmp_path / "tokenizers").exists()
