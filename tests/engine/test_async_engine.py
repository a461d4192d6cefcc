"""AsyncLLMEngine against a stand-in core: a request's prompts travel as one op, all or nothing; a
core that ends unasked is a death (streams fail with EngineDeadError, the hook runs once); the drain's
abort_all ends every open stream with the given error and aborts it in the core."""
from __future__ import annotations

import asyncio
import logging
import threading
from types import SimpleNamespace

import pytest
import torch

from folovllm import SamplingParams
from folovllm.engine.async_engine import (
    AsyncLLMEngine,
    EngineDeadError,
    EngineShutdownError,
)
from folovllm.engine.core_client import ThreadCore
from folovllm.engine.core_loop import (
    AbortOp,
    AddOp,
    EngineInfo,
    IterationMessage,
    StopOp,
)

PARAMS = SamplingParams(max_tokens=4)


class FakeCore:
    """Records what is sent; the test plays the core's side through ``reply``."""

    def __init__(self) -> None:
        self.info = EngineInfo("fake", 64)
        self.sent: list = []
        self.on_message = None

    def send(self, op) -> None:
        self.sent.append(op)

    def attach(self, loop, on_message) -> None:
        self.on_message = on_message

    def is_alive(self) -> bool:
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        pass

    def reply(self, message: IterationMessage) -> None:
        self.on_message(message)


async def _started(on_death=None) -> tuple[AsyncLLMEngine, FakeCore]:
    core = FakeCore()
    engine = AsyncLLMEngine(core, on_death=on_death)
    engine.start()
    return engine, core


def test_prompts_of_one_request_are_one_op():
    async def scenario():
        engine, core = await _started()
        adding = asyncio.ensure_future(engine.add_requests(["r-p0", "r-p1", "r-p2"], ["a", "b", "c"], PARAMS))
        await asyncio.sleep(0)
        [op] = core.sent
        assert isinstance(op, AddOp) and op.request_ids == ["r-p0", "r-p1", "r-p2"]
        assert op.prompts == ["a", "b", "c"]
        core.reply(IterationMessage(accepted=[(rid, None) for rid in op.request_ids]))
        streams = await adding
        assert [s.request_id for s in streams] == op.request_ids

        error = ValueError("the prompt is empty; give at least one token")
        adding = asyncio.ensure_future(engine.add_requests(["s-p0", "s-p1"], ["x", ""], PARAMS))
        await asyncio.sleep(0)
        core.reply(IterationMessage(accepted=[("s-p0", error), ("s-p1", error)]))
        with pytest.raises(ValueError, match="empty"):
            await adding
        assert engine.num_pending == 0

    asyncio.run(scenario())


def test_a_core_that_ends_unasked_is_dead():
    deaths = []

    async def scenario():
        engine, core = await _started(on_death=deaths.append)
        adding = asyncio.ensure_future(engine.add_request("a", "hi", PARAMS))
        await asyncio.sleep(0)
        core.reply(IterationMessage(accepted=[("a", None)]))
        stream = await adding
        died = EngineDeadError("the engine process died (killed by SIGKILL)")
        core.reply(IterationMessage(stopped=True, error=died))
        with pytest.raises(EngineDeadError, match="SIGKILL"):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await engine.add_request("b", "hi", PARAMS)
        assert not engine.is_running

    asyncio.run(scenario())
    assert len(deaths) == 1 and "SIGKILL" in str(deaths[0])


def test_a_requested_stop_is_no_death():
    deaths = []

    async def scenario():
        engine, core = await _started(on_death=deaths.append)
        stopping = asyncio.ensure_future(engine.shutdown(timeout_s=5))
        await asyncio.sleep(0)
        assert isinstance(core.sent[-1], StopOp)
        core.reply(IterationMessage(stopped=True, error=EngineShutdownError("the server is shutting down")))
        await stopping
        assert engine.dead_error is None

    asyncio.run(scenario())
    assert deaths == []


def test_abort_all_fails_open_streams_and_aborts_them_in_the_core():
    async def scenario():
        engine, core = await _started()
        adding = asyncio.ensure_future(engine.add_request("a", "hi", PARAMS))
        await asyncio.sleep(0)
        core.reply(IterationMessage(accepted=[("a", None)]))
        stream = await adding
        pending = asyncio.ensure_future(engine.add_request("b", "hi", PARAMS))  # not accepted yet
        await asyncio.sleep(0)
        assert engine.abort_all(EngineShutdownError("drain timeout")) == 2
        with pytest.raises(EngineShutdownError):
            await pending
        with pytest.raises(EngineShutdownError):
            async for _ in stream:
                pass
        assert {op.request_id for op in core.sent if isinstance(op, AbortOp)} == {"a", "b"}

    asyncio.run(scenario())


def test_a_failing_engine_thread_is_reported_as_dead(caplog):
    """--no-engine-process: the loop's exception ends its thread; the server hears of it."""
    def broken() -> bool:
        raise RuntimeError("injected loop failure")

    stub = SimpleNamespace(model_path="stub", max_model_len=8, default_sampling={}, device=torch.device("meta"),
                           has_unfinished_requests=broken, cache_config_info=dict, platform_info={}, cross_encoder=False,
                           vocab_size=64, pooler_config=None,
                           platform=SimpleNamespace(set_threads=lambda n: None),
                           config=SimpleNamespace(kv_role=None, threads_per_rank=1),
                           model=SimpleNamespace(weight_bytes=lambda: 0))
    died = threading.Event()

    async def scenario():
        engine = AsyncLLMEngine(ThreadCore(stub), on_death=lambda error: died.set())
        engine.start()
        await asyncio.wait_for(engine._stopped.wait(), 10)
        assert "injected loop failure" in str(engine.dead_error)

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert died.is_set()
    assert any("engine loop failed" in r.getMessage() for r in caplog.records)
