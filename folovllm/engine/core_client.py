"""Where the engine-core loop runs: its own process (the default for serving) or a thread.

A process keeps the model's forward passes off the server's GIL: the event loop parses requests and
streams tokens while the engine computes (vLLM's EngineCore does the same). Both kinds offer one
interface: ``info``, ``send(op)``, ``attach(loop, on_message)``, ``is_alive()``, ``close()``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import os
import queue
import threading
from collections import Counter
from collections.abc import Callable

from folovllm.config import EngineConfig
from folovllm.distributed.launch import RankFailedError, describe_exit
from folovllm.engine.core_loop import EngineInfo, IterationMessage, Op, engine_info, run_core_loop
from folovllm.engine.errors import EngineDeadError
from folovllm.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

OnMessage = Callable[[IterationMessage], None]
_PARENT_CHECK_S = 1.0  # how often an idle engine process checks that the server still lives


def _drain(ops: queue.Queue, block: bool, timeout: float | None = None) -> list[Op]:
    """Every op queued now; with ``block``, waits (up to ``timeout``) for the first."""
    taken: list[Op] = []
    if block:
        try:
            taken.append(ops.get(timeout=timeout))
        except queue.Empty:
            return taken
    while True:
        try:
            taken.append(ops.get_nowait())
        except queue.Empty:
            return taken


def _died(cause: str) -> IterationMessage:
    """The last message of a core that nobody stopped: logged loudly, its requests fail."""
    logger.error("the engine %s; failing its requests", cause)
    return IterationMessage(stopped=True, error=EngineDeadError(f"the engine {cause}"))


def _detached(message: IterationMessage) -> IterationMessage:
    """The engine thread goes on mutating its stats: the event loop gets a copy of them."""
    if message.snapshot is not None:
        stats = message.snapshot.stats
        message.snapshot.stats = dataclasses.replace(stats, finished_by_reason=Counter(stats.finished_by_reason))
    return message


class ThreadCore:
    """The loop on a daemon thread of this process (``folovllm serve --no-engine-process``)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.info = engine_info(engine)
        self._ops: queue.Queue[Op] = queue.Queue()
        self._thread: threading.Thread | None = None

    def send(self, op: Op) -> None:
        self._ops.put(op)

    def attach(self, loop: asyncio.AbstractEventLoop, on_message: OnMessage) -> None:
        def run() -> None:
            # OpenMP's thread count is per thread: set it on this thread too
            self.engine.platform.set_threads(self.engine.config.threads_per_rank)
            def emit(message: IterationMessage) -> None:
                loop.call_soon_threadsafe(on_message, _detached(message))

            try:
                run_core_loop(self.engine, lambda block: _drain(self._ops, block), emit)
            except BaseException as err:
                logger.exception("the engine loop failed")
                emit(_died(f"loop failed: {err!r}"))

        self._thread = threading.Thread(target=run, name="folovllm-engine", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


class ProcessCore:
    """The loop in a child process (spawned: CUDA and OpenMP do not survive fork). Ops go down a
    multiprocessing queue; messages come back on a pipe that the event loop watches (no reader thread)."""

    def __init__(self, config: EngineConfig, log_level: int = logging.INFO, name: str = "folovllm-engine") -> None:
        ctx = multiprocessing.get_context("spawn")
        self._ops = ctx.Queue()
        self._conn, child_conn = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_core_process_main, name=name,
                                 args=(config, self._ops, child_conn, log_level), daemon=True)
        self._proc.start()
        child_conn.close()  # the child holds the only write end: EOF here means it died
        self._loop: asyncio.AbstractEventLoop | None = None
        self.info: EngineInfo | None = None

    def wait_ready(self, timeout_s: float = 600.0) -> EngineInfo:
        """Blocks until the child has loaded the model; raises its start-up error if it failed."""
        if not self._conn.poll(timeout_s):
            self.close(0)
            raise RuntimeError(f"the engine process did not start within {timeout_s:.0f} s")
        try:
            message = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the engine process exited with code {self._proc.exitcode} "
                               "while starting (see its log above)") from None
        if isinstance(message, Exception):
            self._proc.join()
            raise message
        self.info = message
        return message

    def send(self, op: Op) -> None:
        self._ops.put(op)  # a feeder thread writes it: never blocks the event loop

    def attach(self, loop: asyncio.AbstractEventLoop, on_message: OnMessage) -> None:
        self._loop = loop
        loop.add_reader(self._conn.fileno(), self._read, on_message)
        # uvloop makes a watched fd non-blocking; then a message larger than the pipe's buffer, or one
        # the child is still writing on a loaded machine, reads as EAGAIN halfway, which looked like a
        # death. Once poll() says a message has begun, recv() waits for its end.
        os.set_blocking(self._conn.fileno(), True)

    def _read(self, on_message: OnMessage) -> None:
        try:
            while self._conn.poll():
                message = self._conn.recv()
                on_message(message)
                if message.stopped:  # it was told to stop: its exit is no death
                    self._loop.remove_reader(self._conn.fileno())
                    return
        except (EOFError, OSError):
            self._loop.remove_reader(self._conn.fileno())
            self._proc.join(1.0)  # the pipe closes as it exits: reap it to read the exit code
            on_message(_died(f"process died ({describe_exit(self._proc.exitcode)})"))

    def is_alive(self) -> bool:
        return self._proc.is_alive()

    def close(self, timeout_s: float = 30.0) -> None:
        if self._loop is not None and not self._conn.closed:
            self._loop.remove_reader(self._conn.fileno())
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            if timeout_s > 0:
                logger.warning("the engine process did not stop in %.0f s; terminating it", timeout_s)
            self._proc.terminate()
            self._proc.join()
        self._ops.close()
        self._conn.close()


def _core_process_main(config: EngineConfig, ops, conn, log_level: int) -> None:
    """The child: build the engine, say ready (or why not), loop until STOP or the server is gone."""
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s (engine): %(message)s")
    try:
        engine = LLMEngine(config)
    except ValueError as err:  # bad settings: the server prints it and exits
        conn.send(err)
        return
    except Exception as err:
        logger.exception("the engine failed to start")
        conn.send(RuntimeError(f"engine start-up failed: {err!r}"))
        return
    conn.send(engine_info(engine))
    parent = multiprocessing.parent_process()

    def inbox(block: bool) -> list[Op]:
        while True:
            taken = _drain(ops, block, _PARENT_CHECK_S)
            if taken or not block:
                return taken
            if parent is not None and not parent.is_alive():
                logger.warning("the server process is gone; the engine exits")
                raise SystemExit(0)
            engine.check_health()  # an idle engine notices a dead tensor-parallel rank too

    try:
        run_core_loop(engine, inbox, conn.send)
    except (BrokenPipeError, ConnectionResetError):
        logger.warning("the server closed the connection; the engine exits")
    except RankFailedError as err:
        logger.error("%s; the engine exits", err)
        raise SystemExit(1) from None
    finally:
        engine.shutdown()
