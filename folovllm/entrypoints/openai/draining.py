"""SIGTERM drain: new requests get 503 while in-flight ones finish, then the rest are aborted.

Also ends the server a moment after the engine died, so a supervisor can restart it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import uvicorn

from folovllm.engine.async_engine import AsyncLLMEngine, EngineShutdownError
from folovllm.entrypoints.openai.middleware import route_path
from folovllm.entrypoints.openai.serving import shutting_down

logger = logging.getLogger(__name__)

_DEATH_FLUSH_S = 1.0  # after the engine died, time for the error responses to reach their clients


@dataclass
class ServerState:
    draining: bool = False  # set on SIGTERM: new requests get 503 while in-flight ones finish
    engine_died_at: float | None = None  # time.monotonic() when the engine died: the server exits


class DrainGate:
    """ASGI middleware (not BaseHTTPMiddleware, which would wrap every streamed chunk): 503 while draining."""

    def __init__(self, app, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.state.draining and route_path(scope) != "/metrics":
            await shutting_down().response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


class DrainingServer(uvicorn.Server):
    """uvicorn's graceful shutdown (stop listening, let in-flight requests finish) with our own drain
    timeout: at ``drain_timeout_s`` every request still open is aborted in the engine, so each ends
    with an error response instead of being cancelled mid-body. Also exits once the engine died."""

    def __init__(self, config: uvicorn.Config, state: ServerState, engine: AsyncLLMEngine,
                 drain_timeout_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.engine = engine
        self.drain_timeout_s = drain_timeout_s

    def handle_exit(self, sig, frame) -> None:
        if not self.state.draining:
            logger.info("draining: finishing in-flight requests, refusing new ones")
        self.state.draining = True
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        died = self.state.engine_died_at
        return died is not None and time.monotonic() - died >= _DEATH_FLUSH_S

    async def shutdown(self, sockets=None) -> None:
        timer = asyncio.get_running_loop().call_later(self.drain_timeout_s, self._abort_in_flight)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _abort_in_flight(self) -> None:
        count = self.engine.abort_all(EngineShutdownError(
            f"the server is shutting down: the request did not finish within the "
            f"{self.drain_timeout_s:g} s drain timeout"))
        if count:
            logger.warning("drain timeout: aborted %d unfinished request(s)", count)
