"""--kv-cache-dtype through the engine: greedy agreement with the unquantized cache (a Llama and a Gemma 3 with
sliding-window layers; chunked prefill and prefix-cache hits on), the capacity the same memory holds, what
/metrics' cache_config_info says, and the settings that are errors."""
from __future__ import annotations

import pytest
import torch

from folovllm import SamplingParams
from folovllm.config import EngineConfig
from tests.engine.conftest import make_llm, random_prompts
from tests.model.test_gemma3 import random_hf_model, tiny_gemma3_config
from tests.tiers import library_missing

NOT_BUILT = library_missing()
BACKENDS = ["torch", pytest.param("cpu", marks=pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}"))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny_gemma3_kv")
    random_hf_model(tiny_gemma3_config()).save_pretrained(path, safe_serialization=True)
    return str(path)


def greedy_tokens(model_dir: str, prompts: list[list[int]], **kwargs) -> tuple[list[list[int]], int]:
    """Each prompt's greedy tokens, and how many prompt tokens came from the prefix cache."""
    llm = make_llm(model_dir, max_num_batched_tokens=32, **kwargs)  # prompts longer than 32 are chunked
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], sum(o.num_cached_tokens or 0 for o in outputs)


def match_rate(ours: list[list[int]], reference: list[list[int]]) -> float:
    """The share of tokens equal to the reference's up to each sequence's first difference."""
    agreed = 0
    for a, b in zip(ours, reference):
        agreed += next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
    return agreed / sum(len(b) for b in reference)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_greedy_agreement_with_the_unquantized_cache(tiny_llama_dir: str, tiny_gemma3_dir: str, model: str,
                                                     backend: str, kv_cache_dtype: str) -> None:
    model_dir = tiny_llama_dir if model == "llama" else tiny_gemma3_dir
    prompts = random_prompts(6, seed=1, low=20, high=70) if model == "llama" else [
        torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 45, 70)]
    prompts += [prompts[0] + prompts[1][:9]]  # a prefix-cache hit on the first prompt's blocks
    reference, _ = greedy_tokens(model_dir, prompts, attention_backend=backend)
    ours, cached = greedy_tokens(model_dir, prompts, attention_backend=backend, kv_cache_dtype=kv_cache_dtype)
    rate = match_rate(ours, reference)
    print(f"{model} {backend} {kv_cache_dtype}: greedy match rate {rate:.3f}")
    assert cached > 0
    # a random tiny model has near-tied logits: a loose floor, the rate itself is what to read
    assert rate >= {"int8": 0.5, "fp8_e4m3": 0.3, "fp8_e5m2": 0.2}[kv_cache_dtype]


def test_the_same_memory_holds_about_twice_the_tokens_of_bf16(tiny_llama_dir: str) -> None:
    tokens = {}
    for kv_cache_dtype in ("auto", "int8", "fp8"):
        llm = make_llm(tiny_llama_dir, dtype="bfloat16", attention_backend="torch", num_gpu_blocks_override=None,
                       kv_cache_memory="8MiB", kv_cache_dtype=kv_cache_dtype)
        info = llm.llm_engine.cache_config_info()
        tokens[kv_cache_dtype] = int(info["num_cache_tokens"])
        assert info["cache_dtype"] == {"auto": "bfloat16", "int8": "int8", "fp8": "fp8_e4m3"}[kv_cache_dtype]
    # head_dim 16: 32 bytes a bf16 row against 16 codes + a 2-byte scale
    assert tokens["int8"] / tokens["auto"] >= 1.75 and tokens["fp8"] == tokens["int8"]


def test_capacity_ratio_at_the_default_models_shape() -> None:
    from folovllm.attention.kv_quant import KV_CACHE_FORMATS
    from folovllm.worker.cache_sizing import bytes_per_block

    shape = (30, 16, 3, 64)  # SmolLM2-135M: layers, block size, KV heads, head_dim
    bf16, fp32 = bytes_per_block(*shape, torch.bfloat16), bytes_per_block(*shape, torch.float32)
    for fmt in KV_CACHE_FORMATS.values():
        assert bf16 / bytes_per_block(*shape, torch.bfloat16, fmt) >= 1.9
        assert fp32 / bytes_per_block(*shape, torch.float32, fmt) >= 3.8


def test_settings_that_are_errors() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="calculate_kv_scales"):
        EngineConfig(kv_cache_dtype="fp8", calculate_kv_scales=True)


def test_triton_in_its_interpreter_agrees_with_the_torch_backend(tiny_llama_dir: str) -> None:
    pytest.importorskip("triton")
    from tests.helpers import use_triton_interpreter_without_cuda

    use_triton_interpreter_without_cuda()
    prompts = random_prompts(3, seed=2, low=10, high=30)
    torch_tokens, _ = greedy_tokens(tiny_llama_dir, prompts, attention_backend="torch", kv_cache_dtype="int8")
    triton_tokens, _ = greedy_tokens(tiny_llama_dir, prompts, attention_backend="triton", kv_cache_dtype="int8")
    rate = match_rate(triton_tokens, torch_tokens)
    print(f"triton vs torch, int8 KV: greedy match rate {rate:.3f}")
    assert rate >= 0.5  # triton also reads a fresh prompt's K/V from the quantized cache; torch does not
