"""Prefill/decode disaggregation with two engines in one process: a producer prefills and holds the
KV, a consumer pulls it (shared storage, or gloo point to point) and decodes. Greedy tokens match one
colocated engine; the consumer computes one prompt token per request; every block comes back."""
from __future__ import annotations

import time

import pytest

from folovllm import SamplingParams
from tests.engine.conftest import make_llm, random_prompts

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PREFILL = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True,
                         extra_args={"kv_transfer_params": {"do_remote_decode": True}})


def decode_params(kv_transfer_params: dict) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                          extra_args={"kv_transfer_params": kv_transfer_params})


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(4, seed=3, low=5, high=40)


@pytest.fixture(scope="module")
def colocated(tiny_llama_dir, prompts) -> list[list[int]]:
    llm = make_llm(tiny_llama_dir)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                                          use_tqdm=False)]


def settle(llm, timeout_s: float = 30.0) -> None:
    """Steps an engine until it holds nothing for another instance (the held KV is freed by a step)."""
    engine = llm.llm_engine
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        engine.step()


def disaggregated(producer, consumer, prompts: list[list[int]]) -> list[list[int]]:
    inputs = [{"prompt_token_ids": p} for p in prompts]
    handed = producer.generate(inputs, PREFILL, use_tqdm=False)
    assert all(o.kv_transfer_params["do_remote_prefill"] for o in handed)
    outputs = consumer.generate(inputs, [decode_params(o.kv_transfer_params) for o in handed], use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], outputs


@pytest.mark.parametrize("connector, copy_mb", [("shared_storage", 0), ("torch_distributed", 0),
                                               ("torch_distributed", 1e-5)])  # one layer per step
def test_disaggregated_tokens_match_colocated(tiny_llama_dir, prompts, colocated, connector, copy_mb, tmp_path):
    config = {"kv_connector": connector, "kv_connector_extra_config": {"shared_storage_path": str(tmp_path),
                                                                       "load_copy_mb_per_step": copy_mb}}
    producer = make_llm(tiny_llama_dir, kv_transfer_config={**config, "kv_role": "kv_producer"})
    consumer = make_llm(tiny_llama_dir, kv_transfer_config={**config, "kv_role": "kv_consumer"})
    try:
        p_engine, c_engine = producer.llm_engine, consumer.llm_engine
        p_start, c_start = p_engine.kv_cache.num_free_blocks, c_engine.kv_cache.num_free_blocks
        tokens, outputs = disaggregated(producer, consumer, prompts)
        assert tokens == colocated
        # the consumer computed exactly one prompt token per request: the rest arrived
        assert c_engine.stats.prompt_tokens == len(prompts)
        assert [o.num_external_computed_tokens for o in outputs] == [len(p) - 1 for p in prompts]
        assert c_engine.stats.kv_transfer_loads == len(prompts)
        # every transferred block is counted once: K and V of every layer, the cache's own dtype
        layer_k = c_engine.worker.runner.kv_caches[0][0]
        block_bytes = 2 * len(c_engine.worker.runner.kv_caches) * layer_k[0].nbytes
        block_size = c_engine.config.block_size
        blocks = sum(-(-(len(p) - 1) // block_size) for p in prompts)
        assert c_engine.stats.kv_transfer_recv_bytes == blocks * block_bytes
        assert c_engine.stats.kv_transfer_recv_seconds > 0.0
        settle(producer)
        assert p_engine.stats.kv_transfer_sends == len(prompts)
        assert p_engine.kv_cache.num_free_blocks == p_start and not p_engine.kv_cache.held
        assert c_engine.kv_cache.num_free_blocks == c_start
        assert list(tmp_path.iterdir()) == []  # the consumer removed what it read
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()


def test_both_role_serves_as_producer_and_consumer(tiny_llama_dir, prompts, colocated, tmp_path):
    config = {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
    one, other = make_llm(tiny_llama_dir, kv_transfer_config=config), make_llm(tiny_llama_dir, kv_transfer_config=config)
    assert disaggregated(one, other, prompts)[0] == colocated
    assert disaggregated(other, one, prompts)[0] == colocated


def test_a_failed_pull_recomputes_locally(tiny_llama_dir, prompts, colocated):
    producer = make_llm(tiny_llama_dir, kv_role="producer", kv_connector="torch_distributed")
    consumer = make_llm(tiny_llama_dir, kv_role="consumer", kv_connector="torch_distributed", kv_transfer_timeout=2.0)
    try:
        handed = producer.generate({"prompt_token_ids": prompts[0]}, PREFILL, use_tqdm=False)[0]
        gone = {**handed.kv_transfer_params, "remote_request_id": "never-held"}
        output = consumer.generate({"prompt_token_ids": prompts[0]}, decode_params(gone), use_tqdm=False)[0]
        assert output.outputs[0].token_ids == colocated[0]
        assert output.num_external_computed_tokens == 0
        assert consumer.llm_engine.stats.kv_transfer_load_failures == 1
        assert consumer.llm_engine.stats.prompt_tokens == len(prompts[0])
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()


def test_producer_frees_held_blocks_when_no_consumer_comes(tiny_llama_dir, prompts):
    producer = make_llm(tiny_llama_dir, kv_role="producer", kv_connector="torch_distributed",
                        kv_transfer_timeout=0.2)
    try:
        engine = producer.llm_engine
        start = engine.kv_cache.num_free_blocks
        producer.generate({"prompt_token_ids": prompts[0]}, PREFILL, use_tqdm=False)
        assert engine.kv_cache.held and engine.kv_cache.num_free_blocks < start
        settle(producer)
        assert not engine.kv_cache.held and engine.kv_cache.num_free_blocks == start
    finally:
        producer.llm_engine.shutdown()


def test_consumer_without_params_runs_as_usual(tiny_llama_dir, prompts, colocated):
    consumer = make_llm(tiny_llama_dir, kv_role="consumer")
    try:
        outputs = consumer.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == colocated
        assert all(o.kv_transfer_params is None for o in outputs)
    finally:
        consumer.llm_engine.shutdown()


@pytest.mark.parametrize("connector", ["shared_storage", "torch_distributed"])
@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_a_quantized_cache_moves_its_codes_and_scales(tiny_llama_dir, prompts, colocated, connector, kv_cache_dtype,
                                                      tmp_path):
    config = {"kv_connector": connector, "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
    producer = make_llm(tiny_llama_dir, kv_cache_dtype=kv_cache_dtype,
                        kv_transfer_config={**config, "kv_role": "kv_producer"})
    consumer = make_llm(tiny_llama_dir, kv_cache_dtype=kv_cache_dtype,
                        kv_transfer_config={**config, "kv_role": "kv_consumer"})
    try:
        c_engine = consumer.llm_engine
        tokens, outputs = disaggregated(producer, consumer, prompts)
        assert [o.num_external_computed_tokens for o in outputs] == [len(p) - 1 for p in prompts]
        # a block is one-byte codes plus each row's 2-byte scale: head_dim 16 -> 18 bytes a row
        layer_k = c_engine.worker.runner.kv_caches[0][0]
        assert layer_k.shape[-1] == 18 and layer_k.element_size() == 1
        block_bytes = 2 * len(c_engine.worker.runner.kv_caches) * layer_k[0].nbytes
        blocks = sum(-(-(len(p) - 1) // c_engine.config.block_size) for p in prompts)
        assert c_engine.stats.kv_transfer_recv_bytes == blocks * block_bytes
        # the first token reads the whole prompt from the moved blocks (dequantized): it is the unquantized one
        assert [t[0] for t in tokens] == [t[0] for t in colocated]
        settle(producer)
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()
