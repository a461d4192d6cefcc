"""The FastAPI app and its uvicorn server: routes, API key, backpressure, metrics, SIGTERM drain.

Lifecycle: on SIGTERM new requests get 503 and in-flight ones may finish for ``--drain-timeout``
seconds; then the rest are aborted in the engine and each ends with a 503 error (a stream's last event
before ``[DONE]``), and the server exits 0. If the engine dies, in-flight requests get a 500
``engine_dead`` error, /health turns 503, and the server exits 1 a moment later (for a supervisor).
"""
from __future__ import annotations

import argparse
import copy
import functools
import logging
import secrets
import signal
import time
from contextlib import asynccontextmanager
from dataclasses import fields

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

import folovllm
from folovllm.config import EngineConfig
from folovllm.engine.async_engine import AsyncLLMEngine, EngineDeadError
from folovllm.engine.core_client import ProcessCore, ThreadCore
from folovllm.engine.core_loop import EngineInfo
from folovllm.engine.dp_core import DataParallelCore
from folovllm.engine.llm_engine import LLMEngine
from folovllm.entrypoints.openai.body_limit import BodySizeLimit
from folovllm.entrypoints.openai.draining import DrainGate, DrainingServer, ServerState
from folovllm.entrypoints.openai.errors import ERROR_RESPONSES, APIError, bad_request, install_error_handlers
from folovllm.entrypoints.openai.http_stack import check_http_stack, describe_http_stack
from folovllm.entrypoints.openai.lora_serving import LoRAServing
from folovllm.entrypoints.openai.metrics import RejectionCounter, ServerMetrics
from folovllm.entrypoints.openai.middleware import InFlight, RequestIdHeader, ServerLoad
from folovllm.entrypoints.openai.openapi import EMPTY_OK, STREAMED, TEXT_OK, ServerLimits, server_openapi
from folovllm.entrypoints.openai.protocol import CompletionRequest
from folovllm.entrypoints.openai.protocol_chat import (
    ChatCompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from folovllm.entrypoints.openai.responses_store import ResponseStore, check_store_bounds
from folovllm.entrypoints.openai.serving import ClientDisconnected, ServingContext, now_s
from folovllm.entrypoints.openai.serving_chat import ChatServing
from folovllm.entrypoints.openai.serving_completion import CompletionServing
from folovllm.entrypoints.openai.serving_messages import (
    AnthropicErrorShape,
    MessagesServing,
    add_messages_routes,
    anthropic_shaped,
)
from folovllm.entrypoints.openai.serving_pooling import PoolingServing, add_pooling_routes
from folovllm.entrypoints.openai.serving_responses import ResponsesServing, add_responses_routes
from folovllm.entrypoints.openai.server_args import ServerConfig, chat_settings, server_config
from folovllm.entrypoints.openai.validation import RequestLimits

logger = logging.getLogger(__name__)

# /invocations reads its body itself: a chat completion's or a completion's
INVOCATIONS_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"anyOf": [
    {"$ref": "#/components/schemas/ChatCompletionRequest"}, {"$ref": "#/components/schemas/CompletionRequest"}]}}}}}
_ABORT_GRACE_S = 5.0  # after the drain timeout aborted the rest, time for their streams to end
ENGINE_DEAD_EXIT_CODE = 1


def build_app(core: ProcessCore | ThreadCore | DataParallelCore, tokenizer, config: ServerConfig,
              state: ServerState | None = None) -> FastAPI:
    """The app over one started engine core; its messages are routed between lifespan start-up and
    shutdown. ``tokenizer`` is the server's own (chat templates, /tokenize, logprob text)."""
    state = state or ServerState()
    metrics = ServerMetrics(config.model_name, config.metrics_prefix, core.info.max_model_len,
                            core.info.cache_config, num_engines=core.info.data_parallel_size,
                            weight_bytes=core.info.weight_bytes, platform=core.info.platform)

    def on_engine_death(error: EngineDeadError) -> None:
        metrics.reset_gauges()
        state.engine_died_at = time.monotonic()
        logger.error("the engine is dead (%s): the server exits with code %d", error,
                     ENGINE_DEAD_EXIT_CODE)

    engine = AsyncLLMEngine(core, on_iteration=metrics.on_iteration, on_death=on_engine_death)
    ctx = ServingContext(engine, config.model_names, tokenizer, config.max_waiting_requests, config.limits,
                         chat_settings=config.chat, on_admitted=metrics.observe_params,
                         prompt_tokens_details=config.prompt_tokens_details, log_requests=config.log_requests,
                         structured_outputs_backend=config.structured_outputs_backend)
    completions, chat = CompletionServing(ctx), ChatServing(ctx)
    responses = ResponsesServing(ctx, chat, ResponseStore(config.max_stored_responses, config.stored_response_ttl_s))
    loras = LoRAServing(ctx, engine, config.enable_lora, config.allow_runtime_lora_updating, config.lora_modules)
    load = InFlight()

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        engine.start()
        await loras.check_start_modules()
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
        bearer = scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode("latin-1"), expected_key)
        api_key = request.headers.get("x-api-key")  # Anthropic's header
        if not bearer and not (api_key is not None and secrets.compare_digest(api_key.strip().encode("latin-1"),
                                                                              expected_key)):
            raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>' or "
                                "'x-api-key: <key>'", type="authentication_error", code="invalid_api_key")

    # redirect_slashes off: "/v1/completions/" is a 404 with an error body, not a 307 a client may not follow
    app = FastAPI(title="FoloVLLM", lifespan=lifespan, redirect_slashes=False, root_path=config.root_path,
                  responses=ERROR_RESPONSES)
    app.add_middleware(BodySizeLimit, max_bytes=config.limits.max_request_body_bytes)
    app.add_middleware(DrainGate, state=state)
    app.add_middleware(RejectionCounter, metrics=metrics)  # sees the gate's 503s too
    app.add_middleware(ServerLoad, load=load)
    app.add_middleware(RequestIdHeader)  # every response carries its X-Request-Id, errors included
    app.add_middleware(AnthropicErrorShape)  # errors on /v1/messages in Anthropic's shape, whoever gave them
    cors = config.cors
    app.add_middleware(CORSMiddleware, allow_origins=cors.allowed_origins,  # outermost: answers preflights
                       allow_methods=cors.allowed_methods, allow_headers=cors.allowed_headers,
                       allow_credentials=cors.allow_credentials)
    install_error_handlers(app, anthropic_shaped)
    app.openapi = server_openapi(app, server_limits(core.info, ctx, config))
    generates = not core.info.pooling  # the generation routes are in /openapi.json on a generating engine
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])

    @v1.post("/completions", responses=STREAMED, include_in_schema=generates)
    async def create_completion(body: CompletionRequest, raw: Request):
        return await _handle(completions.create(body, raw))

    @v1.post("/chat/completions", responses=STREAMED, include_in_schema=generates)
    async def create_chat_completion(body: ChatCompletionRequest, raw: Request):
        return await _handle(chat.create(body, raw))

    @v1.get("/models")
    async def list_models():
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": now_s(), "owned_by": "folovllm",
            "root": engine.info.model_path, "max_model_len": ctx.max_model_len} for name in config.model_names]
            + loras.model_cards(engine.info.model_path)}

    v1.include_router(loras.router())
    add_responses_routes(v1, responses, _handle)
    add_messages_routes(v1, MessagesServing(ctx, chat), _handle)

    guarded = [Depends(require_api_key)]
    add_pooling_routes(app, v1, PoolingServing(ctx), guarded)
    app.include_router(v1)

    @app.get("/health", response_class=Response, responses=EMPTY_OK)
    async def health():
        if not engine.is_running:
            dead = engine.dead_error
            raise APIError(503, f"the engine is dead: {dead}" if dead else "the engine is not running",
                           type="service_unavailable")
        return Response(status_code=200)

    for method in ("GET", "POST"):  # SageMaker's health check; one route per method keeps operation ids unique
        app.add_api_route("/ping", health, methods=[method], name=f"ping_{method.lower()}",
                          response_class=Response, responses=EMPTY_OK)

    @app.get("/version")
    async def version():
        return {"version": folovllm.__version__}

    @app.get("/load")
    async def server_load():
        return {"server_load": load.count}

    @app.post("/invocations", dependencies=[Depends(require_api_key)], responses=STREAMED,
              openapi_extra=INVOCATIONS_BODY, include_in_schema=generates)
    async def invocations(raw: Request):
        """SageMaker's single endpoint: a body with "messages" is a chat completion, one with
        "prompt" a completion."""
        try:
            body = await raw.json()
        except ValueError as err:
            raise bad_request(f"the request body is not valid JSON: {err}") from err
        kind = next((k for k in ("messages", "prompt") if isinstance(body, dict) and k in body), None)
        if kind is None:
            raise bad_request('no endpoint takes this body: /invocations expects a chat completion '
                              '("messages") or a completion ("prompt")')
        try:
            if kind == "messages":
                return await _handle(chat.create(ChatCompletionRequest.model_validate(body), raw))
            return await _handle(completions.create(CompletionRequest.model_validate(body), raw))
        except ValidationError as err:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in err.errors()]) from err

    @app.get("/metrics", response_class=Response, responses=TEXT_OK)
    async def prometheus_metrics():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize", dependencies=guarded)
    async def tokenize(body: TokenizeRequest):
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of prompt or messages", "prompt")
        validator = ctx.validator
        if body.messages is not None:
            tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
            tokens = await ctx.off_loop(functools.partial(
                validator.render_chat, body.messages, body.add_generation_prompt, tools=tools,
                documents=body.documents, template_kwargs=body.chat_template_kwargs,
                continue_final_message=body.continue_final_message))
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


def server_limits(info: EngineInfo, ctx: ServingContext, config: ServerConfig) -> ServerLimits:
    """What /openapi.json states of this server: its vocabulary, context and request limits, its features."""
    validator, limits = ctx.validator, config.limits
    vocab = min(info.vocab_size or len(ctx.tokenizer), len(ctx.tokenizer))
    return ServerLimits(max_token_id=vocab - 1, max_model_len=ctx.max_model_len,
                        max_prompt_chars=validator.max_prompt_chars, max_n=limits.max_n,
                        max_prompts=limits.max_prompts_per_request, max_stop_strings=limits.max_stop_strings,
                        max_stop_string_chars=limits.max_stop_string_chars,
                        kv_transfer_params=info.kv_role is not None,
                        request_chat_template=config.chat.trust_request_chat_template)


async def _handle(coro):
    try:
        return await coro
    except ClientDisconnected:
        return JSONResponse({}, status_code=499)  # nobody reads it; the request was aborted


def start_engine_core(engine_config: EngineConfig, own_process: bool, log_level: str
                      ) -> tuple[ProcessCore | ThreadCore | DataParallelCore, object]:
    """Starts the engine core (N replicas under data parallelism) and returns it with a tokenizer
    for the server; the child processes load the model while this process loads the tokenizer."""
    if engine_config.data_parallel_size > 1 and not own_process:
        raise ValueError("--data-parallel-size runs each replica in its own engine process; "
                         "drop --no-engine-process")
    if not own_process:
        engine = LLMEngine(engine_config)
        return ThreadCore(engine), copy.deepcopy(engine.tokenizer)
    from folovllm.model.loader import default_model_path
    from folovllm.model.loader.hub import resolve_model_files
    from folovllm.model.loader.tokenizer import load_tokenizer

    engine_config = resolve_model_files(engine_config)  # once, here: the child gets local paths
    level = getattr(logging, log_level.upper())
    core = (DataParallelCore.start(engine_config, level) if engine_config.data_parallel_size > 1
            else ProcessCore(engine_config, level))
    try:
        tokenizer = load_tokenizer(engine_config.tokenizer or engine_config.model or default_model_path())
        core.wait_ready()
    except BaseException:
        core.close(0)
        raise
    return core, tokenizer


def run_server(args: argparse.Namespace, engine_config: EngineConfig) -> int:
    """Serves until SIGINT/SIGTERM, then drains; returns the exit code (non-zero: the engine died)."""
    if args.max_waiting_requests is not None and args.max_waiting_requests < 0:
        raise ValueError(f"--max-waiting-requests must be >= 0; got {args.max_waiting_requests}")
    check_store_bounds(args.max_stored_responses, args.stored_response_ttl)
    limits = RequestLimits(**{f.name: getattr(args, f.name) for f in fields(RequestLimits)})
    chat = chat_settings(args)  # before the engine starts: a bad flag fails fast
    check_http_stack(args.uvicorn_http, args.uvicorn_loop)
    core, tokenizer = start_engine_core(engine_config, args.engine_process, args.log_level)
    config = server_config(args, engine_config, core.info.model_path, limits, chat)
    state = ServerState()
    app = build_app(core, tokenizer, config, state)
    # uvicorn cancels what is left only after our own drain timeout aborted it and streams had time to end
    uv_config = uvicorn.Config(app, host=args.host, port=args.port,
                               log_level=args.uvicorn_log_level or args.log_level,
                               timeout_graceful_shutdown=config.drain_timeout_s + _ABORT_GRACE_S,
                               access_log=False, ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
                               http=args.uvicorn_http, loop=args.uvicorn_loop)
    scheme = "https" if args.ssl_certfile else "http"
    logger.info("serving %r on %s://%s:%d%s (%s)", config.model_name, scheme, args.host, args.port, args.root_path,
                describe_http_stack(args.uvicorn_http, args.uvicorn_loop))
    # uvicorn re-raises the signal it shut down on, with the handler found at start: make that a
    # no-op so a drained SIGTERM ends in exit code 0, not death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    DrainingServer(uv_config, state, app.state.engine, config.drain_timeout_s).run()
    if state.engine_died_at is not None:
        return ENGINE_DEAD_EXIT_CODE
    logger.info("drained; bye")
    return 0
