"""DataParallelCore over stand-in replicas: ops go where the router says, messages come back tagged
with their replica, a stop ends the merged stream once every replica stopped, a death ends it at once."""
from __future__ import annotations

import asyncio

import pytest

from folovllm.config import EngineConfig
from folovllm.engine.async_engine import AsyncLLMEngine
from folovllm.engine.core_loop import (
    AbortOp,
    AddOp,
    EngineInfo,
    EngineSnapshot,
    IterationMessage,
    StopOp,
)
from folovllm.engine.dp_core import DataParallelCore, prompt_token_ids, replica_configs
from folovllm.engine.errors import EngineDeadError, EngineShutdownError
from folovllm.engine.output_delta import OutputDelta, SampleDelta
from folovllm.engine.stats import EngineStats
from folovllm.outputs import RequestMetrics
from folovllm.sampling_params import SamplingParams


class FakeReplica:
    """What DataParallelCore uses of a ProcessCore; ``emit`` plays a message from its engine."""

    def __init__(self, num_blocks: int = 64) -> None:
        self.sent: list = []
        self.on_message = None
        self.alive = True
        self.num_blocks = num_blocks

    def wait_ready(self, timeout_s: float = 600.0) -> EngineInfo:
        return EngineInfo("model", 256, cache_config={"num_gpu_blocks": str(self.num_blocks)})

    def send(self, op) -> None:
        self.sent.append(op)

    def attach(self, loop, on_message) -> None:
        self.on_message = on_message

    def emit(self, message: IterationMessage) -> None:
        self.on_message(message)

    def is_alive(self) -> bool:
        return self.alive

    def close(self, timeout_s: float = 30.0) -> None:
        self.alive = False


def snap(waiting: int = 0) -> EngineSnapshot:
    return EngineSnapshot(EngineStats(), num_running=0, num_waiting=waiting, kv_usage=0.0)


def delta(request_id: str, tokens: list[int], finished: bool = False) -> OutputDelta:
    sample = SampleDelta(0, tokens, 0, "", None, None, "length" if finished else None, None)
    return OutputDelta(request_id, [sample], finished, RequestMetrics(arrival_time=0.0), 0)


def add(request_id: str, prompt: list[int], max_tokens: int = 8) -> AddOp:
    return AddOp([request_id], [{"prompt_token_ids": prompt}], SamplingParams(max_tokens=max_tokens), 0.0)


@pytest.fixture
def core() -> tuple[DataParallelCore, list[FakeReplica], list[IterationMessage]]:
    replicas = [FakeReplica(), FakeReplica()]
    dp = DataParallelCore(replicas, routing="least_loaded", block_size=4)
    info = dp.wait_ready()
    assert info.data_parallel_size == 2 and dp.router.indexes[0].capacity_blocks == 64
    seen: list[IterationMessage] = []
    dp.attach(None, seen.append)
    return dp, replicas, seen


def test_ops_go_to_the_replica_the_router_picks(core) -> None:
    dp, replicas, _ = core
    dp.send(add("a", list(range(40))))
    dp.send(add("b", list(range(100, 104))))
    assert [op.request_ids for op in replicas[0].sent] == [["a"]]
    assert [op.request_ids for op in replicas[1].sent] == [["b"]]
    dp.send(AbortOp("a"))
    dp.send(AbortOp("never-routed"))  # ended already or unknown: nobody is bothered
    assert isinstance(replicas[0].sent[-1], AbortOp) and len(replicas[1].sent) == 1
    dp.send(StopOp())
    assert all(isinstance(r.sent[-1], StopOp) for r in replicas)


def test_messages_are_tagged_and_drive_the_load(core) -> None:
    dp, replicas, seen = core
    dp.send(add("a", list(range(10)), max_tokens=5))
    dp.send(add("bad", list(range(50, 53)), max_tokens=5))
    assert dp.router.load == [15, 8]
    replicas[1].emit(IterationMessage(accepted=[("bad", ValueError("too long"))], snapshot=snap()))
    replicas[0].emit(IterationMessage(accepted=[("a", None)], outputs=[delta("a", [7, 8])], snapshot=snap()))
    assert dp.router.load == [3, 0]
    assert [m.snapshot.engine for m in seen] == [1, 0]
    replicas[0].emit(IterationMessage(outputs=[delta("a", [9], finished=True)], snapshot=snap()))
    assert dp.router.load == [0, 0] and dp.router.num_open == 0


def test_a_stop_ends_the_merged_stream_with_the_last_replica(core) -> None:
    dp, replicas, seen = core
    dp.send(add("a", [1, 2, 3]))
    dp.send(StopOp())
    error = EngineShutdownError("the server is shutting down")
    replicas[0].emit(IterationMessage(failed=["a"], error=error, stopped=True, snapshot=snap()))
    replicas[1].emit(IterationMessage(stopped=True, snapshot=snap()))
    assert [(m.failed, m.stopped) for m in seen] == [(["a"], False), ([], True)]


def test_a_dead_replica_ends_the_stream_and_stops_the_others(core) -> None:
    dp, replicas, seen = core
    replicas[1].emit(IterationMessage(stopped=True, error=EngineDeadError("the engine process died (SIGKILL)")))
    assert len(seen) == 1 and seen[0].stopped and isinstance(seen[0].error, EngineDeadError)
    assert "data-parallel engine 1" in str(seen[0].error) and "SIGKILL" in str(seen[0].error)
    assert isinstance(replicas[0].sent[-1], StopOp)
    replicas[0].emit(IterationMessage(stopped=True, snapshot=snap()))  # the survivor's last words: dropped
    assert len(seen) == 1
    replicas[1].alive = False
    assert not dp.is_alive()


def test_async_engine_sums_waiting_over_replicas_and_knows_each_streams_replica(core) -> None:
    dp, replicas, _ = core

    async def scenario() -> None:
        engine = AsyncLLMEngine(dp)
        engine.start()  # attaches the engine's own handler in place of the fixture's
        task = asyncio.ensure_future(engine.add_request("x", {"prompt_token_ids": [1, 2]}, SamplingParams()))
        await asyncio.sleep(0)
        holder = dp.router.replica_of("x")
        replicas[holder].emit(IterationMessage(accepted=[("x", None)], snapshot=snap(waiting=1)))
        replicas[1 - holder].emit(IterationMessage(snapshot=snap(waiting=2)))
        stream = await task
        assert stream.engine == holder and engine.num_pending == 3

    asyncio.run(scenario())


def test_replica_configs_split_threads_and_traces() -> None:
    configs = replica_configs(EngineConfig(device="cpu", data_parallel_size=2, num_threads=5, trace_path="t.jsonl"))
    assert [(c.data_parallel_size, c.num_threads, c.trace_path) for c in configs] == [
        (1, 2, "t.engine0.jsonl"), (1, 2, "t.engine1.jsonl")]
    tp = replica_configs(EngineConfig(device="cpu", data_parallel_size=2, tensor_parallel_size=2, num_threads=4))
    assert [c.threads_per_rank for c in tp] == [1, 1]  # two replicas of two ranks share four threads
    with pytest.raises(ValueError, match="replica r on cuda:r"):
        replica_configs(EngineConfig(device="cuda:1", data_parallel_size=2))


def test_prompt_token_ids_of_each_prompt_form() -> None:
    assert prompt_token_ids({"prompt_token_ids": [1, 2]}) == [1, 2]
    assert prompt_token_ids([3]) == [3]
    assert prompt_token_ids("text") is None and prompt_token_ids({"prompt": "text"}) is None


def test_one_engine_refuses_data_parallelism() -> None:
    from folovllm.engine.llm_engine import LLMEngine

    with pytest.raises(ValueError, match="server feature"):
        LLMEngine(EngineConfig(data_parallel_size=2))
