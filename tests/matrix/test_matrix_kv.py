"""The feature matrix, KV cache: prefix-cache hits, preemption under a KV budget too small for the batch, and
quantized KV (int8, fp8_e4m3) inside decode CUDA graphs, each against the plain engine on the same device.
On the CPU these are the twins (the same code, small); on CUDA they run in the GPU check."""
from __future__ import annotations

import pytest

from tests.engine.conftest import random_prompts
from tests.engine.test_kv_cache_dtype import match_rate
from tests.matrix.engines import DEVICES, count_graph_replays, engine, greedy, token_prompts
from tests.tolerance import assert_greedy_match, logprob_gaps

VOCAB = 512  # tiny_llama_dir's
BLOCK = 16


def tokens_and_gaps(llm, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(max_tokens), use_tqdm=False)
    return [(list(o.outputs[0].token_ids), logprob_gaps(o.outputs[0])) for o in outs]


def assert_all_match(ours: list[list[int]], reference: list[tuple[list[int], list[float]]]) -> None:
    assert len(ours) == len(reference)
    for tokens, (ref_tokens, ref_gaps) in zip(ours, reference):
        assert_greedy_match(tokens, ref_tokens, ref_gaps)


@pytest.mark.parametrize("device", DEVICES)
def test_a_shared_prefix_is_served_from_the_cache_with_the_same_tokens(llama_dir: str, device: str) -> None:
    prefix = token_prompts(1, seed=1, low=3 * BLOCK + 5, high=3 * BLOCK + 6, vocab=VOCAB)[0]
    prompts = [prefix + tail for tail in token_prompts(2, seed=2, low=3, high=9, vocab=VOCAB)]
    reference = tokens_and_gaps(engine(llama_dir, device, enable_prefix_caching=False), prompts, 12)
    llm = engine(llama_dir, device)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], greedy(12), use_tqdm=False)[0]
    second = llm.generate([{"prompt_token_ids": prompts[1]}], greedy(12), use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 3 * BLOCK  # the prefix's full blocks
    assert_all_match([first.outputs[0].token_ids, second.outputs[0].token_ids], reference)


@pytest.mark.parametrize("device", DEVICES)
def test_preempted_requests_finish_with_the_tokens_they_get_alone(llama_dir: str, device: str) -> None:
    prompts = token_prompts(4, seed=3, low=30, high=60, vocab=VOCAB)
    alone = engine(llama_dir, device)
    reference = [tokens_and_gaps(alone, [p], 16)[0] for p in prompts]
    # 8 blocks of 16 = 128 KV slots, against 4 x 46-76 the batch would hold at once
    small = engine(llama_dir, device, num_gpu_blocks_override=8, max_model_len=128)
    ours = [tokens for tokens, _ in tokens_and_gaps(small, prompts, 16)]
    assert small.llm_engine.scheduler.num_preemptions > 0
    assert small.llm_engine.kv_cache.num_free_blocks == 8
    assert_all_match(ours, reference)


# On CUDA the K/V rows are written by the fused q/k norm + rotary + store kernel, or by the torch forms when
# FOLOVLLM_CUDA_FUSED_OPS is off: both writers are checked (the switch changes nothing on the CPU).
FUSED_WRITES = [pytest.param("on", id="fused"), pytest.param("off", id="torch-write")]


@pytest.mark.parametrize("kv_cache_dtype, floor", [("int8", 0.5), ("fp8_e4m3", 0.3)])  # the CPU tests' floors
@pytest.mark.parametrize("device, fused", [("cpu", "on")] + [
    pytest.param(device.values[0], fused.values[0], marks=device.marks, id=f"cuda-{fused.id}")
    for device in DEVICES[1:] for fused in FUSED_WRITES])
def test_quantized_kv_agrees_with_the_unquantized_cache_inside_graphs(llama_dir: str, device: str, fused: str,
                                                                     kv_cache_dtype: str, floor: float,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU test's prompts and measure (tests/engine/test_kv_cache_dtype.py); bf16 on CUDA, where decode
    steps replay CUDA graphs that read and write the quantized cache, and four times the prompts there (cheap)
    so that the rate is less a matter of a few near-ties."""
    monkeypatch.setenv("FOLOVLLM_CUDA_FUSED_OPS", fused)
    dtype = "bfloat16" if device == "cuda" else "float32"
    prompts = random_prompts(6 if device == "cpu" else 24, seed=1, low=20, high=70)
    prompts.append(prompts[0] + prompts[1][:9])  # a prefix-cache hit on the first prompt's blocks
    plain = engine(llama_dir, device, dtype=dtype, max_num_batched_tokens=32)  # longer prompts are chunked
    reference = [tokens for tokens, _ in tokens_and_gaps(plain, prompts, 12)]
    llm = engine(llama_dir, device, dtype=dtype, max_num_batched_tokens=32, kv_cache_dtype=kv_cache_dtype)
    replays = count_graph_replays(llm)
    ours = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(12), use_tqdm=False)
    rate = match_rate([list(o.outputs[0].token_ids) for o in ours], reference)
    print(f"{device} {dtype} {kv_cache_dtype}: greedy match rate {rate:.3f}, {replays[0]} graph replays")
    assert sum(o.num_cached_tokens or 0 for o in ours) > 0
    assert llm.llm_engine.cache_config_info()["cache_dtype"] == kv_cache_dtype
    assert rate >= floor
    assert replays[0] > 0 or device == "cpu"
