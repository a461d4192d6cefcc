"""AsyncLLMEngine: one background thread steps the LLMEngine; asyncio callers get per-request streams.

    asyncio side (server)                     engine thread
    add_request() ── ops queue + notify ──►   apply adds/aborts, step(), batch outputs
    RequestStream ◄── call_soon_threadsafe ──  one callback per step for all outputs

Only the engine thread touches the LLMEngine; requests from all clients are batched at step
granularity because they all land in the same scheduler.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import torch

from folovllm.engine.llm_engine import LLMEngine, PromptInput
from folovllm.outputs import RequestOutput
from folovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Called on the engine thread after every loop iteration (step or not) with that step's outputs.
IterationHook = Callable[[LLMEngine, list[RequestOutput]], None]


class EngineShutdownError(RuntimeError):
    """The engine stopped (server shutdown) before the request finished."""


class RequestStream:
    """The outputs of one request, in order; iterate with ``async for``. Cumulative, like RequestOutput."""

    def __init__(self, request_id: str, engine: AsyncLLMEngine) -> None:
        self.request_id = request_id
        self.finished = False
        self._queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._engine = engine

    def put(self, item: RequestOutput | Exception) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        """Yields outputs until the finished one; leaving early (client gone) aborts the request."""
        try:
            while not self.finished:
                item = await self._queue.get()
                if isinstance(item, Exception):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
        finally:
            if not self.finished:
                self._engine.abort(self.request_id)


@dataclass
class _AddOp:
    request_id: str
    prompt: PromptInput
    params: SamplingParams
    arrival_time: float
    stream: RequestStream
    accepted: asyncio.Future
    priority: int = 0
    user: str | None = None


class AsyncLLMEngine:
    """Runs ``LLMEngine.step()`` on a dedicated thread that sleeps while there is no work."""

    def __init__(self, engine: LLMEngine, on_iteration: IterationHook | None = None) -> None:
        self.engine = engine
        self.on_iteration = on_iteration
        self._ops: list[_AddOp | str] = []  # adds and aborts (request ids), applied in order
        self._wakeup = threading.Condition()
        self._streams: dict[str, RequestStream] = {}  # owned by the engine thread
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the engine thread; call from the event loop that will consume the streams."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="folovllm-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def shutdown(self) -> None:
        """Aborts whatever is left, fails its streams and joins the engine thread."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    # -- requests (event-loop side) -----------------------------------------------------------

    async def add_request(self, request_id: str, prompt: PromptInput, params: SamplingParams,
                          arrival_time: float | None = None, priority: int = 0,
                          user: str | None = None) -> RequestStream:
        """Queues a request; raises the engine's ValueError (bad prompt) before any output."""
        if self._loop is None or self._stopping:
            raise EngineShutdownError("the engine is not running")
        stream = RequestStream(request_id, self)
        accepted = self._loop.create_future()
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        self._submit(_AddOp(request_id, prompt, params, arrival, stream, accepted, priority, user))
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id)  # the caller went away while the request was being queued
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Aborts a request (its KV blocks are freed before the next step); safe from any thread."""
        self._submit(request_id)

    @property
    def num_pending(self) -> int:
        """Requests submitted but not yet scheduled (the admission queue for backpressure)."""
        adds = sum(isinstance(op, _AddOp) for op in list(self._ops))
        return adds + len(self.engine.scheduler.waiting)

    def _submit(self, op: _AddOp | str) -> None:
        with self._wakeup:
            self._ops.append(op)
            self._wakeup.notify()

    # -- the engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        if engine.device.type == "cpu":  # OpenMP's thread count is per thread: set it here too
            torch.set_num_threads(engine.config.num_threads or os.cpu_count() or 1)
        while True:
            with self._wakeup:
                while not self._ops and not self._stopping and not engine.has_unfinished_requests():
                    self._wakeup.wait()
                ops, self._ops = self._ops, []
                stopping = self._stopping
            self._apply(ops)
            if stopping:
                self._abort_all(EngineShutdownError("the server is shutting down"))
                self._call_hook([])
                return
            outputs: list[RequestOutput] = []
            if engine.has_unfinished_requests():
                try:
                    outputs = engine.step()
                except Exception as err:  # a bug must not hang every client: fail them, keep serving
                    logger.exception("engine step failed; aborting all requests")
                    self._abort_all(err)
            self._call_hook(outputs)  # first: a client that got its output sees it in the metrics
            self._deliver(outputs)

    def _apply(self, ops: list[_AddOp | str]) -> None:
        for op in ops:
            if isinstance(op, str):
                self.engine.abort_request(op)
                self._streams.pop(op, None)
                continue
            try:
                self.engine.add_request(op.prompt, op.params, op.request_id, op.arrival_time,
                                        priority=op.priority, user=op.user)
            except ValueError as err:
                self._loop.call_soon_threadsafe(_resolve, op.accepted, err)
                continue
            self._streams[op.request_id] = op.stream
            self._loop.call_soon_threadsafe(_resolve, op.accepted, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        batch = []
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            batch.append((stream, output))
            if output.finished:
                del self._streams[output.request_id]
        if batch:  # one cross-thread callback per step, not one per request
            self._loop.call_soon_threadsafe(_put_all, batch)

    def _abort_all(self, error: Exception) -> None:
        for request_id in list(self.engine.groups):
            self.engine.abort_request(request_id)
        streams, self._streams = self._streams, {}
        if streams:
            self._loop.call_soon_threadsafe(_put_all, [(s, error) for s in streams.values()])

    def _call_hook(self, outputs: list[RequestOutput]) -> None:
        if self.on_iteration is None:
            return
        try:
            self.on_iteration(self.engine, outputs)
        except Exception:
            logger.exception("the iteration hook failed")


def _resolve(future: asyncio.Future, error: Exception | None) -> None:
    if future.done():  # cancelled by its caller meanwhile
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _put_all(batch: list[tuple[RequestStream, RequestOutput | Exception]]) -> None:
    for stream, item in batch:
        stream.put(item)
