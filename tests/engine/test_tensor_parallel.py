"""Tensor parallelism end to end on CPU: two gloo ranks (spawned, loopback) give TP=1's greedy tokens on
tiny models built with transformers' own classes, each rank holding its share of the KV heads; a dead
rank ends the engine with a clear error and leaves no process behind."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from folovllm import SamplingParams
from folovllm.bench.gpu_runs import save_tokenizer
from folovllm.config import EngineConfig
from folovllm.distributed.launch import RankFailedError
from folovllm.engine.core_client import ProcessCore
from tests.engine.conftest import TINY_VOCAB, make_llm, random_prompts

SHAPE = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=256, eos_token_id=2, bos_token_id=1)
MODELS = {  # name -> (transformers class, config, KV heads per rank at TP=2)
    "llama": (LlamaForCausalLM, LlamaConfig(**SHAPE, num_key_value_heads=2, initializer_range=0.2,
                                            tie_word_embeddings=False), 1),
    "qwen3-tied": (Qwen3ForCausalLM, Qwen3Config(**SHAPE, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
                                                 tie_word_embeddings=True), 1),
    "llama-one-kv-head": (LlamaForCausalLM, LlamaConfig(**SHAPE, num_key_value_heads=1, initializer_range=0.2,
                                                        tie_word_embeddings=False), 1),  # replicated
    "gemma3-windowed": (Gemma3ForCausalLM, Gemma3TextConfig(**SHAPE, num_key_value_heads=2, head_dim=16,
                                                            initializer_range=0.2, sliding_window=4,
                                                            layer_types=["sliding_attention", "full_attention"]), 1),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    dirs = {}
    for name, (cls, config, _) in MODELS.items():
        torch.manual_seed(0)
        path = tmp_path_factory.mktemp(name)
        cls(config).eval().save_pretrained(path, safe_serialization=True)
        save_tokenizer(path)
        dirs[name] = str(path)
    return dirs


def _generate(llm, prompts: list[list[int]]) -> list:
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    scored = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=2, logprobs=2)
    params = [scored if i % 3 == 0 else greedy for i in range(len(prompts))]
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_two_ranks_give_the_greedy_tokens_of_one(name: str, model_dirs: dict[str, str]) -> None:
    prompts = random_prompts(6, seed=3)
    expected = _generate(make_llm(model_dirs[name]), prompts)
    llm = make_llm(model_dirs[name], tensor_parallel_size=2)
    try:
        got = _generate(llm, prompts)
        worker = llm.llm_engine.worker
        kv_heads = MODELS[name][2]
        assert worker.model.num_kv_heads == kv_heads
        assert worker.runner.kv_caches[0][0].shape[2] == kv_heads  # rank 0's cache holds only its heads
    finally:
        llm.llm_engine.shutdown()
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    for mine, theirs in zip(got, expected):  # prompt logprobs: rank 0's gathered logits, slice by slice
        for a, b in zip(mine.prompt_logprobs or [], theirs.prompt_logprobs or []):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.keys() == b.keys()
                for token in a:
                    assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-4)
    assert not any(rank.is_alive() for rank in worker.ranks)  # shutdown leaves no process behind


def test_a_killed_rank_ends_the_engine_with_a_clear_error(model_dirs: dict[str, str]) -> None:
    llm = make_llm(model_dirs["llama"], tensor_parallel_size=2)
    ranks = llm.llm_engine.worker.ranks
    try:
        os.kill(ranks[0].process.pid, signal.SIGKILL)
        ranks[0].join(10)
        with pytest.raises(RankFailedError, match=r"rank 1 \(pid \d+\) killed by SIGKILL"):
            llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2), use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()


def _wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    return alive


def test_ranks_exit_when_the_engine_process_is_killed(model_dirs: dict[str, str]) -> None:
    config = EngineConfig(model=model_dirs["llama"], dtype="float32", block_size=4, max_model_len=256,
                          num_gpu_blocks_override=64, tensor_parallel_size=2)
    core = ProcessCore(config)
    try:
        core.wait_ready(300)
        ranks = psutil.Process(core._proc.pid).children()
        assert len(ranks) >= 1
        os.kill(core._proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while core.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = _wait_gone(ranks, 60)  # each rank reads EOF on its pipe from rank 0 and exits
        assert not alive, f"orphaned rank processes: {[p.pid for p in alive]}"
    finally:
        core.close(0)


def test_heads_that_do_not_split_are_a_clear_error_and_leave_no_rank(model_dirs: dict[str, str]) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match="num_key_value_heads=2 is fewer than tp_size=3"):
        make_llm(model_dirs["llama"], tensor_parallel_size=3)
    spawned = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not _wait_gone(spawned, 30)
