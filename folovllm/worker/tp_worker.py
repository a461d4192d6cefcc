"""Tensor parallelism seen from the engine: one worker object, N ranks behind it.

Rank 0 runs in the engine's process (it samples and hands tokens back); the other ranks of this
machine are processes it spawns (worker/rank_main.py), those of other machines connect to it
(distributed/nodes.py; each node starts its own, worker/worker_node.py). Every call the engine makes is
sent to the other ranks first (one pickled message each, distributed/channel.py), then run on rank 0;
the ranks meet in the model's collectives. A rank that dies makes the next call raise ``RankFailedError``.
"""
from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from folovllm.config import EngineConfig
from folovllm.distributed.channel import send_to_ranks
from folovllm.distributed.group import TPGroup, init_tp_group
from folovllm.distributed.launch import (
    LOOPBACK,
    RENDEZVOUS_TIMEOUT,
    RankFailedError,
    RankProcess,
    rendezvous_store,
    spawn_rank,
)
from folovllm.distributed.nodes import RemoteRank, StepListener, gloo_address
from folovllm.model.arch import ArchConfig
from folovllm.platforms import platform_for
from folovllm.sample.rows import SamplingRow
from folovllm.sampling_params import SamplingParams
from folovllm.worker.model_runner import LaunchedStep, ModelRunner
from folovllm.worker.rank_main import DETERMINE_NUM_KV_BLOCKS, INITIALIZE_CACHE, STEP
from folovllm.worker.step_input import ScheduledRequest, StepInput, StepOutput
from folovllm.worker.worker import Worker

logger = logging.getLogger(__name__)

RANK_MAIN = "folovllm.worker.rank_main"
_STOP_TIMEOUT_S = 10.0
T = TypeVar("T")
# What a rank that does not sample gets for a row that samples: only that it samples (one shared
# object, pickled once per message, instead of every row's settings and penalty token lists).
_SAMPLES = SamplingRow(SamplingParams())


def follower_step(step: StepInput) -> StepInput:
    """The step as the ranks that do not sample need it: each row's sampling settings reduced to a flag."""
    return StepInput([ScheduledRequest(r.request_id, r.new_token_ids, r.num_pending_tokens, r.num_computed_tokens,
                                       r.block_table, None if r.sampling is None else _SAMPLES, r.prompt_logprobs,
                                       draft_token_ids=r.draft_token_ids,  # verify rows attend as decode rows
                                       draft_rows=[_SAMPLES] * len(r.draft_rows), keep=r.keep)
                      for r in step.requests], step.finished_request_ids, step.decodes)


def _stop_ranks(ranks: list[RankProcess | RemoteRank]) -> None:
    for rank in ranks:  # a closed pipe is the stop signal: each rank reads EOF and returns
        rank.conn.close()
    for rank in ranks:
        rank.stop(_STOP_TIMEOUT_S)


class TensorParallelWorker:
    """The engine's worker when ``tensor_parallel_size > 1``: same interface as ``Worker``."""

    def __init__(self, config: EngineConfig, model_path: str) -> None:
        size = config.tensor_parallel_size
        if config.node_rank != 0:
            raise ValueError(f"node_rank={config.node_rank} runs no engine: start that node with `folovllm serve "
                             f"MODEL -tp {size} --nnodes {config.nnodes} --node-rank {config.node_rank} "
                             "--master-addr A --master-port P` (it runs only its ranks)")
        host = config.master_addr or LOOPBACK
        # hosts the rendezvous: kept for the group's life
        store = self._store = rendezvous_store(size, host, config.master_port or 0)
        log_level = logging.getLogger().getEffectiveLevel()
        self.send_s = 0.0  # host time spent handing messages to the other ranks (the step breakdown reads it)
        self.ranks: list[RankProcess | RemoteRank] = [spawn_rank(RANK_MAIN, rank)
                                                      for rank in range(1, config.ranks_per_node)]
        self._finalizer = weakref.finalize(self, _stop_ranks, self.ranks)
        try:
            if config.nnodes > 1:
                self.ranks.extend(self._accept_other_nodes(config, store, host))
            for rank in self.ranks:
                send_to_ranks([rank.conn], (config, model_path, rank.rank, host, store.port, log_level))
            self.group: TPGroup = init_tp_group(store, 0, size, platform_for(config.torch_device).distributed_backend,
                                                gloo_address(host, config.nnodes))
            self.local = Worker(config, model_path, self.group)
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        logger.info("tensor parallelism: %d ranks over %s on %d node(s); rank 0 in this process", size,
                    self.group.backend, config.nnodes)

    @staticmethod
    def _accept_other_nodes(config: EngineConfig, store: dist.Store, host: str) -> list[RemoteRank]:
        """The ranks of nodes 1..nnodes-1, connected to rank 0's step listener."""
        listener = StepListener(host)
        listener.publish(store)
        logger.info("tensor parallelism: rendezvous at %s:%d; waiting for ranks %d..%d of nodes 1..%d",
                    host, store.port, config.ranks_per_node, config.tensor_parallel_size - 1, config.nnodes - 1)
        hint = (f": start each node R in 1..{config.nnodes - 1} with `folovllm serve MODEL "
                f"-tp {config.tensor_parallel_size} --nnodes {config.nnodes} --node-rank R --master-addr {host} "
                f"--master-port {store.port}` (node R runs ranks R*{config.ranks_per_node} .. "
                f"R*{config.ranks_per_node}+{config.ranks_per_node - 1}), and check that it can reach this address")
        return listener.accept_ranks(range(config.ranks_per_node, config.tensor_parallel_size),
                                     RENDEZVOUS_TIMEOUT.total_seconds(), hint)

    def _wait_ready(self) -> None:
        for rank in self.ranks:
            while not rank.conn.poll(1.0):
                if not rank.is_alive():
                    raise RankFailedError(f"tensor-parallel {rank.describe()} while starting")
            try:
                error = rank.conn.recv()
            except EOFError:
                raise RankFailedError(f"tensor-parallel {rank.describe()} while starting") from None
            if error is not None:
                raise error

    @property
    def arch(self) -> ArchConfig:
        return self.local.arch

    @property
    def model(self) -> torch.nn.Module:
        """Rank 0's model (its slice of every weight)."""
        return self.local.model

    @property
    def runner(self) -> ModelRunner | None:
        return self.local.runner

    def _on_all(self, message: Callable[[], tuple], run_locally: Callable[[], T]) -> T:
        """Sends ``message()`` to the other ranks, runs rank 0's part; a dead rank is a RankFailedError."""
        self.check_health()
        try:
            start = time.perf_counter()
            send_to_ranks([rank.conn for rank in self.ranks], message())
            self.send_s += time.perf_counter() - start
            return run_locally()
        except (OSError, RuntimeError) as err:
            dead = [rank.describe() for rank in self.ranks if not rank.is_alive()]
            if dead or isinstance(err, OSError):
                raise RankFailedError(f"tensor-parallel {', '.join(dead) or 'rank pipe closed'}: "
                                      f"the engine cannot go on ({err})") from err
            raise

    def check_health(self) -> None:
        """RankFailedError if a rank's process has ended."""
        for rank in self.ranks:
            if not rank.is_alive():
                raise RankFailedError(f"tensor-parallel {rank.describe()}: the engine cannot go on")

    def determine_num_kv_blocks(self, max_model_len: int) -> int:
        """The smallest block count any rank can hold."""
        return self._on_all(lambda: (DETERMINE_NUM_KV_BLOCKS, max_model_len),
                            lambda: self.local.determine_num_kv_blocks(max_model_len))

    def initialize_cache(self, num_blocks: int, max_model_len: int) -> None:
        self._on_all(lambda: (INITIALIZE_CACHE, num_blocks, max_model_len),
                     lambda: self.local.initialize_cache(num_blocks, max_model_len))

    def launch(self, step: StepInput) -> LaunchedStep:
        return self._on_all(lambda: (STEP, follower_step(step)), lambda: self.local.launch(step))

    def resolve(self, launched: LaunchedStep) -> StepOutput:
        return self.local.resolve(launched)

    def execute(self, step: StepInput) -> StepOutput:
        return self.resolve(self.launch(step))

    def close(self) -> None:
        """Stops every rank and waits for them (terminating any that hang; also run when collected), then
        this rank's end of the group (see TPGroup.close)."""
        self._finalizer()
        if hasattr(self, "group"):
            self.group.close()
