"""--generation-config: the model's generation_config.json as default sampling settings."""
from __future__ import annotations

import json

import pytest

from folovllm.model.loader.generation_config import default_sampling_overrides


def test_auto_reads_the_models_sampling_keys(tmp_path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 0, "max_new_tokens": 7, "do_sample": True, "bos_token_id": 1}))
    assert default_sampling_overrides(str(tmp_path), "auto") == {
        "temperature": 0.6, "top_p": 0.9, "top_k": -1, "max_tokens": 7}
    assert default_sampling_overrides(str(tmp_path), "vllm") == {}
    assert default_sampling_overrides(str(tmp_path / "model.gguf"), "auto") == {}  # a GGUF file has none


def test_a_folder_must_hold_one(tmp_path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.1}))
    assert default_sampling_overrides("elsewhere", str(tmp_path)) == {"repetition_penalty": 1.1}
    with pytest.raises(ValueError, match="no generation_config.json"):
        default_sampling_overrides("elsewhere", str(tmp_path / "missing"))
