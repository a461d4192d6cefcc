"""Data parallelism: N engine-core processes behind one server, offered as one core.

    AsyncLLMEngine ── send(op) ──► DataParallelCore ── AddOp: the router's choice ──► replica r
                                                    ── AbortOp: the replica holding it   (ProcessCore)
                                                    ── StopOp: every replica
                   ◄── messages ── each replica's IterationMessage, its snapshot tagged ``engine=r``

Each replica is a whole engine (scheduler, KV cache, and its own tensor-parallel ranks if any) built
from the same config with the CPU threads split between them. The router (engine/dp_router.py) sees
every op and message on the way through, which is all it needs to track each replica's load.

A replica that dies ends the server as one engine's death does: every open request fails with
``engine_dead``, the other replicas are told to stop, and the server exits 1.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

from folovllm.config import EngineConfig
from folovllm.engine.core_client import OnMessage, ProcessCore
from folovllm.engine.core_loop import (
    AbortOp,
    AddOp,
    EngineInfo,
    IterationMessage,
    LoRAOp,
    Op,
    StopOp,
)
from folovllm.engine.dp_router import DataParallelRouter, RouterSettings
from folovllm.engine.errors import EngineDeadError
from folovllm.engine.llm_engine import PromptInput
from folovllm.platforms import platform_for, resolve_device

logger = logging.getLogger(__name__)


def replica_configs(config: EngineConfig) -> list[EngineConfig]:
    """One engine config per replica, on the devices the platform gives them (CPU: the threads split evenly;
    CUDA: replica r on ``cuda:r``); a step trace (``--trace``) written per replica."""
    size = config.data_parallel_size
    platform = platform_for(resolve_device(config.device))
    devices = platform.replica_devices(size, config.tensor_parallel_size)
    threads = config.threads_per_replica if platform.shares_cores else config.num_threads
    return [dataclasses.replace(config, data_parallel_size=1, device=devices[r], num_threads=threads,
                                trace_path=_replica_trace(config.trace_path, r))
            for r in range(size)]


def _replica_trace(path: str | None, replica: int) -> str | None:
    if path is None:
        return None
    trace = Path(path)
    return str(trace.with_name(f"{trace.stem}.engine{replica}{trace.suffix}"))


def prompt_token_ids(prompt: PromptInput) -> list[int] | None:
    """The token ids of a prompt the server tokenized (None for text the engine would tokenize)."""
    if isinstance(prompt, dict):
        return prompt.get("prompt_token_ids")
    if isinstance(prompt, list):
        return prompt
    return None


class DataParallelCore:
    """N ``ProcessCore`` replicas behind ProcessCore's interface: ``info``, ``send``, ``attach``,
    ``is_alive``, ``close`` (and ``wait_ready``)."""

    def __init__(self, replicas: list[ProcessCore], routing: str = "prefix_aware", block_size: int = 16) -> None:
        if not replicas:
            raise ValueError("data parallelism needs at least one replica")
        self.replicas = replicas
        self.router: DataParallelRouter | None = None  # sized once the replicas report their KV caches
        self.info: EngineInfo | None = None
        self._routing = routing
        self._block_size = block_size
        self._stop_sent = False
        self._num_stopped = 0
        self._ended = False  # the merged stream has said ``stopped``: nothing more goes out

    @classmethod
    def start(cls, config: EngineConfig, log_level: int = logging.INFO) -> DataParallelCore:
        """Spawns one engine process per replica (they load the model at once); ``wait_ready`` next."""
        configs = replica_configs(config)  # bad settings fail before any process starts
        replicas: list[ProcessCore] = []
        try:
            for r, replica_config in enumerate(configs):
                replicas.append(ProcessCore(replica_config, log_level, name=f"folovllm-engine-{r}"))
        except BaseException:
            for replica in replicas:
                replica.close(0)
            raise
        return cls(replicas, config.dp_routing, config.block_size)

    def wait_ready(self, timeout_s: float = 600.0) -> EngineInfo:
        """Blocks until every replica has loaded the model (they load at once); raises the first
        start-up error."""
        infos = [replica.wait_ready(timeout_s) for replica in self.replicas]
        first = infos[0]
        capacity = min(int(info.cache_config.get("num_gpu_blocks", 65536)) for info in infos)
        self.router = DataParallelRouter(len(self.replicas), RouterSettings(
            policy=self._routing, block_size=self._block_size, max_model_len=first.max_model_len,
            min_match_tokens=self._block_size, index_capacity_blocks=max(capacity, 1)))
        self.info = dataclasses.replace(first, data_parallel_size=len(self.replicas))
        return self.info

    def send(self, op: Op) -> None:
        if isinstance(op, AddOp):
            tokens = [prompt_token_ids(prompt) for prompt in op.prompts]
            replica = self.router.route(op.request_ids, tokens, op.params.max_tokens, op.params.n)
            self.replicas[replica].send(op)
        elif isinstance(op, AbortOp):
            replica = self.router.replica_of(op.request_id)
            if replica is not None:  # otherwise it has ended already: nothing to abort
                self.replicas[replica].send(op)
        elif isinstance(op, LoRAOp):  # every replica holds its own adapters; the first answer is the op's
            for replica in self.replicas:
                replica.send(op)
        else:
            self._stop_sent = True
            for replica in self.replicas:
                replica.send(op)

    def attach(self, loop: asyncio.AbstractEventLoop, on_message: OnMessage) -> None:
        for r, replica in enumerate(self.replicas):
            replica.attach(loop, lambda message, r=r: self._on_replica_message(r, message, on_message))

    def _on_replica_message(self, replica: int, message: IterationMessage, on_message: OnMessage) -> None:
        if self._ended:  # the others' last words after one died: the server has already failed everything
            return
        if message.snapshot is not None:
            message.snapshot.engine = replica
        self._track(message)
        if message.stopped:  # a copy is changed: the replica's own client reads ``stopped`` after us
            if self._stop_sent:  # a stop that was asked for: the merged stream stops with the last one
                self._num_stopped += 1
                message = dataclasses.replace(message, stopped=self._num_stopped == len(self.replicas))
            else:
                cause = message.error or EngineDeadError("it stopped")
                error = EngineDeadError(f"data-parallel engine {replica}: {cause}")
                message = dataclasses.replace(message, error=error)
                logger.error("data-parallel engine %d died; stopping the others", replica)
                self.send(StopOp())
            self._ended = message.stopped
        on_message(message)

    def _track(self, message: IterationMessage) -> None:
        router = self.router
        for request_id, error in message.accepted:
            if error is not None:
                router.release(request_id)
        for delta in message.outputs:
            router.on_output(delta.request_id, sum(len(sample.new_token_ids) for sample in delta.samples))
            if delta.finished:
                router.release(delta.request_id)
        for request_id in message.aborted + message.failed:
            router.release(request_id)

    def is_alive(self) -> bool:
        return bool(self.replicas) and all(replica.is_alive() for replica in self.replicas)

    def close(self, timeout_s: float = 30.0) -> None:
        for replica in self.replicas:  # each was sent the stop already: they wind down together
            replica.close(timeout_s)
