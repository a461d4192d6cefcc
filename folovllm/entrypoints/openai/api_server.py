"""The FastAPI app and its uvicorn server: routes, API key, backpressure, metrics, SIGTERM drain.

Lifecycle: on SIGTERM new requests get 503 and in-flight ones may finish for ``--drain-timeout``
seconds; then the rest are aborted in the engine and each ends with a 503 error (a stream's last event
before ``[DONE]``), and the server exits 0. If the engine dies, in-flight requests get a 500
``engine_dead`` error, /health turns 503, and the server exits 1 a moment later (for a supervisor).
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import os
import secrets
import signal
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from folovllm.config import EngineConfig
from folovllm.engine.async_engine import AsyncLLMEngine, EngineDeadError, EngineShutdownError
from folovllm.engine.core_client import ProcessCore, ThreadCore
from folovllm.engine.llm_engine import LLMEngine
from folovllm.entrypoints.openai.body_limit import BodySizeLimit
from folovllm.entrypoints.openai.errors import APIError, bad_request, install_error_handlers
from folovllm.entrypoints.openai.metrics import RejectionCounter, ServerMetrics
from folovllm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                  DetokenizeRequest, TokenizeRequest)
from folovllm.entrypoints.openai.serving import ClientDisconnected, ServingContext, now_s, shutting_down
from folovllm.entrypoints.openai.serving_chat import ChatServing
from folovllm.entrypoints.openai.serving_completion import CompletionServing
from folovllm.entrypoints.openai.validation import RequestLimits

logger = logging.getLogger(__name__)

_DEATH_FLUSH_S = 1.0  # after the engine died, time for the error responses to reach their clients
_ABORT_GRACE_S = 5.0  # after the drain timeout aborted the rest, time for their streams to end
ENGINE_DEAD_EXIT_CODE = 1


@dataclass
class ServerConfig:
    model_name: str
    api_key: str | None = None
    max_waiting_requests: int | None = None  # None: unbounded admission queue
    drain_timeout_s: float = 30.0
    limits: RequestLimits = field(default_factory=RequestLimits)
    structured_outputs_backend: str = "auto"  # the engine's, for checking constraints here


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
        if scope["type"] == "http" and self.state.draining and scope["path"] != "/metrics":
            await shutting_down().response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_app(core: ProcessCore | ThreadCore, tokenizer, config: ServerConfig,
              state: ServerState | None = None) -> FastAPI:
    """The app over one started engine core; its messages are routed between lifespan start-up and
    shutdown. ``tokenizer`` is the server's own (chat templates, /tokenize, logprob text)."""
    state = state or ServerState()
    metrics = ServerMetrics(config.model_name)

    def on_engine_death(error: EngineDeadError) -> None:
        metrics.reset_gauges()
        state.engine_died_at = time.monotonic()
        logger.error("the engine is dead (%s): the server exits with code %d", error,
                     ENGINE_DEAD_EXIT_CODE)

    engine = AsyncLLMEngine(core, on_iteration=metrics.on_iteration, on_death=on_engine_death)
    ctx = ServingContext(engine, config.model_name, tokenizer, config.max_waiting_requests, config.limits,
                         config.structured_outputs_backend)
    completions, chat = CompletionServing(ctx), ChatServing(ctx)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        engine.start()
        yield
        await engine.shutdown()
        metrics.reset_gauges()
        ctx.close()

    expected_key = config.api_key.encode() if config.api_key is not None else None

    async def require_api_key(request: Request) -> None:
        if expected_key is None:
            return
        # Compared as bytes (headers arrive as latin-1 text), in constant time, whatever they hold.
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode("latin-1"),
                                                                     expected_key):
            raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                           type="authentication_error", code="invalid_api_key")

    # redirect_slashes off: "/v1/completions/" is a 404 with an error body, not a 307 a client may not follow
    app = FastAPI(title="FoloVLLM", lifespan=lifespan, redirect_slashes=False)
    app.add_middleware(BodySizeLimit, max_bytes=config.limits.max_request_body_bytes)
    app.add_middleware(DrainGate, state=state)
    app.add_middleware(RejectionCounter, metrics=metrics)  # outermost: sees the gate's 503s too
    install_error_handlers(app)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])

    @v1.post("/completions")
    async def create_completion(body: CompletionRequest, raw: Request):
        return await _handle(completions.create(body, raw))

    @v1.post("/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, raw: Request):
        return await _handle(chat.create(body, raw))

    @v1.get("/models")
    async def list_models():
        return {"object": "list", "data": [{
            "id": config.model_name, "object": "model", "created": now_s(), "owned_by": "folovllm",
            "root": engine.info.model_path, "max_model_len": ctx.max_model_len}]}

    app.include_router(v1)

    @app.get("/health")
    async def health():
        if not engine.is_running:
            dead = engine.dead_error
            raise APIError(503, f"the engine is dead: {dead}" if dead else "the engine is not running",
                           type="service_unavailable")
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    guarded = [Depends(require_api_key)]

    @app.post("/tokenize", dependencies=guarded)
    async def tokenize(body: TokenizeRequest):
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of prompt or messages", "prompt")
        validator = ctx.validator
        if body.messages is not None:
            tokens = await ctx.off_loop(validator.render_chat, body.messages, body.add_generation_prompt)
        else:
            tokens = await ctx.off_loop(validator.encode, body.prompt, body.add_special_tokens, "prompt")
        return {"tokens": tokens, "count": len(tokens), "max_model_len": ctx.max_model_len}

    @app.post("/detokenize", dependencies=guarded)
    async def detokenize(body: DetokenizeRequest):
        ctx.check_model(body.model)
        return {"prompt": await ctx.off_loop(ctx.validator.detokenize, body.tokens)}

    app.state.engine = engine
    app.state.metrics = metrics
    return app


async def _handle(coro):
    try:
        return await coro
    except ClientDisconnected:
        return JSONResponse({}, status_code=499)  # nobody reads it; the request was aborted


class _DrainingServer(uvicorn.Server):
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


def default_model_name(model_arg: str | None, model_path: str) -> str:
    if model_arg:
        return model_arg
    name = os.path.basename(model_path.rstrip("/"))
    return name.split(".")[0] if name.endswith(".gguf") else name


def add_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: --model, or the default model's name)")
    g.add_argument("--api-key", default=os.environ.get("FOLOVLLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize and /detokenize "
                        "(default: $FOLOVLLM_API_KEY)")
    g.add_argument("--max-waiting-requests", type=int, default=None,
                   help="queued requests beyond this get 503 + Retry-After (default: unbounded)")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds to let in-flight requests finish before aborting them")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    limits = RequestLimits()
    g.add_argument("--max-request-body-bytes", type=int, default=limits.max_request_body_bytes,
                   help="larger request bodies get 413 (default: %(default)s)")
    g.add_argument("--max-prompts-per-request", type=int, default=limits.max_prompts_per_request,
                   help="prompts in one /v1/completions request (default: %(default)s)")
    g.add_argument("--max-n", type=int, default=limits.max_n,
                   help="largest n (samples per prompt) a request may ask for (default: %(default)s)")
    g.add_argument("--max-stop-strings", type=int, default=limits.max_stop_strings,
                   help="stop strings (and stop_token_ids) per request (default: %(default)s)")
    g.add_argument("--max-stop-string-chars", type=int, default=limits.max_stop_string_chars,
                   help="length of each stop string (default: %(default)s)")
    g.add_argument("--no-engine-process", dest="engine_process", action="store_false",
                   help="step the engine on a thread of the server process instead of its own process")


def start_engine_core(engine_config: EngineConfig, own_process: bool, log_level: str
                      ) -> tuple[ProcessCore | ThreadCore, object]:
    """Starts the engine core and returns it with a tokenizer for the server; the child process
    loads the model while this process loads the tokenizer."""
    if not own_process:
        engine = LLMEngine(engine_config)
        return ThreadCore(engine), copy.deepcopy(engine.tokenizer)
    from folovllm.model.loader import default_model_path
    from folovllm.model.tokenizer import load_tokenizer

    core = ProcessCore(engine_config, getattr(logging, log_level.upper()))
    try:
        tokenizer = load_tokenizer(engine_config.model or default_model_path())
        core.wait_ready()
    except BaseException:
        core.close(0)
        raise
    return core, tokenizer


def run_server(args: argparse.Namespace, engine_config: EngineConfig) -> int:
    """Serves until SIGINT/SIGTERM, then drains; returns the exit code (non-zero: the engine died)."""
    if args.max_waiting_requests is not None and args.max_waiting_requests < 0:
        raise ValueError(f"--max-waiting-requests must be >= 0; got {args.max_waiting_requests}")
    limits = RequestLimits(**{f.name: getattr(args, f.name) for f in fields(RequestLimits)})
    core, tokenizer = start_engine_core(engine_config, args.engine_process, args.log_level)
    config = ServerConfig(
        model_name=args.served_model_name or default_model_name(args.model, core.info.model_path),
        api_key=args.api_key or None, max_waiting_requests=args.max_waiting_requests,
        drain_timeout_s=args.drain_timeout, limits=limits,
        structured_outputs_backend=engine_config.structured_outputs_backend)
    state = ServerState()
    app = build_app(core, tokenizer, config, state)
    # uvicorn cancels what is left only after our own drain timeout aborted it and streams had time to end
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                               timeout_graceful_shutdown=config.drain_timeout_s + _ABORT_GRACE_S,
                               access_log=False)
    logger.info("serving %r on http://%s:%d", config.model_name, args.host, args.port)
    # uvicorn re-raises the signal it shut down on, with the handler found at start: make that a
    # no-op so a drained SIGTERM ends in exit code 0, not death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    _DrainingServer(uv_config, state, app.state.engine, config.drain_timeout_s).run()
    if state.engine_died_at is not None:
        return ENGINE_DEAD_EXIT_CODE
    logger.info("drained; bye")
    return 0
