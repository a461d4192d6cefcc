"""Tensor parallelism across two "nodes" on one machine (gloo over loopback): node 1 is
`folovllm serve MODEL -tp 2 --nnodes 2 --node-rank 1 ...` in a subprocess, node 0 the engine. TP=2
across them gives TP=1's greedy tokens; when either node's side ends, the other's ranks end too."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from folovllm import LLM, SamplingParams
from folovllm.bench.gpu_runs import save_tokenizer
from folovllm.config import EngineConfig
from folovllm.distributed.launch import RankFailedError
from folovllm.distributed.nodes import RemoteRank
from folovllm.engine.core_client import ProcessCore

ENGINE = dict(dtype="float32", block_size=4, max_model_len=256, num_gpu_blocks_override=64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=2, bos_token_id=1, initializer_range=0.2, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("two_nodes")
    LlamaForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    return str(path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class NodeOne:
    """`folovllm serve MODEL -tp 2 --nnodes 2 --node-rank 1 --headless` on loopback; its stderr in a file."""

    def __init__(self, model: str, port: int) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "folovllm.entrypoints.cli", "serve", model, "-tp", "2", "--nnodes", "2",
             "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "--headless"],
            stdout=subprocess.DEVNULL, stderr=self.log)

    def ranks(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def kill(self) -> None:
        processes = [psutil.Process(self.proc.pid), *self.ranks()] if self.proc.poll() is None else []
        for process in processes:
            process.kill()
        psutil.wait_procs(processes, timeout=30)
        self.proc.wait(30)
        self.log.close()


def _generate(llm: LLM) -> list[list[int]]:
    prompts = [[5, 6, 7, 8], list(range(10, 40)), [100, 3, 9]]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def _node_zero(model: str, port: int) -> LLM:
    return LLM(model, **ENGINE, tensor_parallel_size=2, nnodes=2, master_addr="127.0.0.1", master_port=port)


def test_two_nodes_give_the_greedy_tokens_of_one(model_dir: str) -> None:
    port = _free_port()
    node = NodeOne(model_dir, port)  # started first: it waits for node 0's rendezvous
    try:
        expected = _generate(LLM(model_dir, **ENGINE))
        llm = _node_zero(model_dir, port)
        try:
            got = _generate(llm)
            ranks = llm.llm_engine.worker.ranks
            assert [(type(r), r.rank) for r in ranks] == [(RemoteRank, 1)]  # no local rank: 1 per node
        finally:
            llm.llm_engine.shutdown()
        assert got == expected
        # rank 1 read EOF when the engine stopped; node 1 followed
        assert node.proc.wait(120) == 0, f"node 1's output:\n{node.output()}"
        assert "rank 1 (pid" in node.output() and "exit code 0" in node.output(), node.output()
    finally:
        node.kill()


def test_a_killed_rank_on_node_one_ends_node_zero_with_a_clear_error(model_dir: str) -> None:
    port = _free_port()
    node = NodeOne(model_dir, port)
    try:
        llm = _node_zero(model_dir, port)
        try:
            [rank] = node.ranks()
            rank.kill()
            rank.wait(30)
            with pytest.raises(RankFailedError, match=r"rank 1 \(127\.0\.0\.1:\d+\) connection lost"):
                _generate(llm)
        finally:
            llm.llm_engine.shutdown()
        assert node.proc.wait(60) == 1  # its rank was killed: node 1 reports it and exits 1
        assert "killed by SIGKILL" in node.output()
    finally:
        node.kill()


@pytest.mark.slow  # the engine-level twin: tests/engine/test_tensor_parallel.py
def test_node_one_exits_when_node_zero_is_killed(model_dir: str) -> None:
    port = _free_port()
    node = NodeOne(model_dir, port)
    core = ProcessCore(EngineConfig(model=model_dir, **ENGINE, tensor_parallel_size=2, nnodes=2,
                                    master_addr="127.0.0.1", master_port=port))
    try:
        core.wait_ready(300)
        ranks = node.ranks()
        assert len(ranks) == 1
        os.kill(core._proc.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs([psutil.Process(node.proc.pid), *ranks], timeout=60)
        assert not alive, f"node 1 left processes behind: {[p.pid for p in alive]}"
    finally:
        core.close(0)
        node.kill()
