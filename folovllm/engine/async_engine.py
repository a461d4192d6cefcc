"""AsyncLLMEngine: the asyncio side of serving; each request gets its own output stream.

    asyncio callers                 AsyncLLMEngine                      engine core (thread/process)
    add_request() / abort()  ──►    AddOp / AbortOp  ── send ──►        run_core_loop (core_loop.py)
    async for out in stream  ◄──    route by request id  ◄── message ── one IterationMessage per step

Requests from all clients are batched at step granularity because they all land in the one scheduler
inside the core (under data parallelism the core is N replicas, engine/dp_core.py, each with its own
scheduler; their replies arrive here interleaved and name their replica). This class keeps only what
the event loop needs: streams, pending adds, the latest queue lengths for backpressure.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable

from folovllm.engine.core_client import ProcessCore, ThreadCore
from folovllm.engine.core_loop import AbortOp, AddOp, EngineInfo, EngineSnapshot, IterationMessage, LoRAOp, StopOp
from folovllm.engine.dp_core import DataParallelCore
from folovllm.engine.errors import (
    EngineDeadError,
    EngineError,
    EngineShutdownError,
    RequestFailedError,
    RequestRefusedError,
)
from folovllm.engine.llm_engine import PromptInput
from folovllm.engine.output_delta import DeltaDecoder
from folovllm.lora.request import LoRARequest
from folovllm.outputs import RequestOutput
from folovllm.sampling_params import SamplingParams

__all__ = ["AsyncLLMEngine", "EngineDeadError", "EngineError", "EngineShutdownError",
           "RequestFailedError", "RequestStream"]

logger = logging.getLogger(__name__)

# Called on the event loop after every core iteration: (snapshot, that step's outputs, aborted ids).
IterationHook = Callable[[EngineSnapshot, list[RequestOutput], list[str]], None]
# Called once on the event loop when the core ended without being asked to (its streams have failed).
DeathHook = Callable[[EngineDeadError], None]


class RequestStream:
    """The outputs of one request, in order; iterate with ``async for``. Cumulative, like RequestOutput."""

    def __init__(self, request_id: str, engine: AsyncLLMEngine) -> None:
        self.request_id = request_id
        self.finished = False
        self.engine = 0  # the data-parallel replica serving it, known once it is accepted
        self.num_output_tokens = 0  # over its choices, as of the latest output the engine handed over
        self._queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._engine = engine

    def put(self, item: RequestOutput | Exception) -> None:
        if isinstance(item, RequestOutput):
            self.num_output_tokens = sum(len(choice.token_ids) for choice in item.outputs)
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


class AsyncLLMEngine:
    """Routes the core's messages to per-request streams on the event loop that called ``start``."""

    def __init__(self, core: ProcessCore | ThreadCore | DataParallelCore, on_iteration: IterationHook | None = None,
                 on_death: DeathHook | None = None) -> None:
        self.core = core
        self.info: EngineInfo = core.info
        self.on_iteration = on_iteration
        self.on_death = on_death
        self.dead_error: EngineDeadError | None = None  # set once the core died
        self._streams: dict[str, RequestStream] = {}
        self._pending: dict[str, tuple[asyncio.Future, RequestStream]] = {}  # sent, not yet accepted
        self._deltas = DeltaDecoder()  # the core sends what is new; streams get cumulative outputs
        self._num_waiting: dict[int, int] = {}  # per replica: its scheduler's waiting queue after its latest step
        self._stopping = False
        self._stopped: asyncio.Event | None = None
        self._lora_ops: dict[str, asyncio.Future] = {}  # adapter loads/unloads sent, not yet answered
        self._lora_ops_seq = itertools.count()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Starts routing; call from the event loop that will consume the streams."""
        self._stopped = asyncio.Event()
        self.core.attach(asyncio.get_running_loop(), self._on_message)

    @property
    def is_running(self) -> bool:
        started = self._stopped is not None
        return started and not self._stopped.is_set() and self.core.is_alive()

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Aborts whatever is left (its streams fail) and waits for the core to stop."""
        self._stopping = True
        if self._stopped is not None and not self._stopped.is_set() and self.core.is_alive():
            self.core.send(StopOp())
            try:
                await asyncio.wait_for(self._stopped.wait(), timeout_s)
            except asyncio.TimeoutError:
                logger.warning("the engine did not answer the stop in %.0f s", timeout_s)
        await asyncio.to_thread(self.core.close)

    # -- requests -----------------------------------------------------------------------------

    async def add_request(self, request_id: str, prompt: PromptInput, params: SamplingParams,
                          arrival_time: float | None = None, priority: int = 0,
                          user: str | None = None, lora_request: LoRARequest | None = None) -> RequestStream:
        """Queues a request; raises the engine's ValueError (bad prompt) before any output."""
        [stream] = await self.add_requests([request_id], [prompt], params, arrival_time, priority, user,
                                           lora_request)
        return stream

    async def add_requests(self, request_ids: list[str], prompts: list[PromptInput],
                           params: SamplingParams, arrival_time: float | None = None,
                           priority: int = 0, user: str | None = None,
                           lora_request: LoRARequest | None = None) -> list[RequestStream]:
        """Queues one request per prompt in one round trip, all or nothing: the engine's ValueError
        for any prompt queues none of them."""
        if self.dead_error is not None:
            raise self.dead_error
        if self._stopped is None or self._stopping or self._stopped.is_set():
            raise EngineShutdownError("the engine is not running")
        for request_id in request_ids:
            if request_id in self._streams or request_id in self._pending:
                raise ValueError(f"request id {request_id!r} is already in use")
        accepted = asyncio.get_running_loop().create_future()  # one answer for the whole op
        streams = [RequestStream(request_id, self) for request_id in request_ids]
        for stream in streams:
            self._pending[stream.request_id] = (accepted, stream)
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        self.core.send(AddOp(list(request_ids), list(prompts), params, arrival, priority, user, lora_request))
        try:
            await accepted
        except asyncio.CancelledError:
            for request_id in request_ids:  # the caller went away while they were being queued
                self.abort(request_id)
            raise
        return streams

    async def update_lora(self, lora_request: LoRARequest, load: bool) -> None:
        """Loads (and checks) an adapter in the core, or drops it; raises the core's ValueError."""
        if self.dead_error is not None:
            raise self.dead_error
        if self._stopped is None or self._stopping or self._stopped.is_set():
            raise EngineShutdownError("the engine is not running")
        op_id = f"lora-op-{next(self._lora_ops_seq)}"
        done = asyncio.get_running_loop().create_future()
        self._lora_ops[op_id] = done
        self.core.send(LoRAOp(op_id, lora_request, load))
        try:
            await done
        finally:
            self._lora_ops.pop(op_id, None)

    def abort(self, request_id: str) -> None:
        """Aborts a request; the core frees its KV blocks before its next step."""
        self._streams.pop(request_id, None)
        self._pending.pop(request_id, None)
        if not self._stopping:
            self.core.send(AbortOp(request_id))

    def abort_all(self, error: EngineError) -> int:
        """Ends every open request now: its stream (or pending add) fails with ``error`` and the
        core frees its blocks. Returns how many requests were open."""
        request_ids = list(self._pending) + list(self._streams)
        self._close_all(error)
        if not self._stopping and self.dead_error is None:
            for request_id in request_ids:
                self.core.send(AbortOp(request_id))
        return len(request_ids)

    @property
    def num_pending(self) -> int:
        """Requests sent but not yet scheduled (the admission queue, for backpressure)."""
        return len(self._pending) + sum(self._num_waiting.values())

    # -- messages from the core (on the event loop) -------------------------------------------

    def _on_message(self, message: IterationMessage) -> None:
        for request_id, error in message.accepted:
            lora_op = self._lora_ops.get(request_id)
            if lora_op is not None:
                if lora_op.done():
                    continue
                if error is None:
                    lora_op.set_result(None)
                else:
                    lora_op.set_exception(error)
                continue
            future, stream = self._pending.pop(request_id, (None, None))
            if future is None:  # its caller went away meanwhile (its abort follows the add)
                continue
            if error is None:
                stream.engine = message.snapshot.engine if message.snapshot is not None else 0
                self._streams[request_id] = stream
                if not future.done():
                    future.set_result(None)
            elif not future.done():
                future.set_exception(error)
        outputs = [self._deltas.decode(delta) for delta in message.outputs]
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                failed = [o for o in output.outputs if o.finish_reason == "error"] if output.finished else []
                reason = failed[0].stop_reason if failed and isinstance(failed[0].stop_reason, str) else None
                # a reason comes with a refusal of the request's own constraint alone (engine/step_results.py)
                stream.put((RequestRefusedError(reason) if reason else RequestFailedError()) if failed else output)
                if output.finished:
                    del self._streams[output.request_id]
        for request_id in message.failed:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put(message.error)
        for request_id in message.aborted + message.failed:
            self._deltas.forget(request_id)
        if message.snapshot is not None:
            self._num_waiting[message.snapshot.engine] = message.snapshot.num_waiting
            self._call_hook(message, outputs)
        if message.stopped:
            error = message.error or EngineShutdownError("the engine stopped")
            if not self._stopping:  # nobody asked it to stop: it died
                self.dead_error = error if isinstance(error, EngineDeadError) else EngineDeadError(str(error))
                error = self.dead_error
            self._close_all(error)
            self._stopped.set()
            if self.dead_error is not None and self.on_death is not None:
                self.on_death(self.dead_error)

    def _close_all(self, error: Exception) -> None:
        """The core is gone: every open stream and pending add fails with ``error``."""
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for future in self._lora_ops.values():
            if not future.done():
                future.set_exception(error)
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()

    def _call_hook(self, message: IterationMessage, outputs: list[RequestOutput]) -> None:
        if self.on_iteration is None:
            return
        try:
            self.on_iteration(message.snapshot, outputs, message.aborted + message.failed)
        except Exception:
            logger.exception("the iteration hook failed")
