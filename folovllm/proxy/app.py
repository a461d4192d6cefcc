"""The proxy's FastAPI app: each generation request is a one-token prefill on a producer, then the
client's request on a consumer carrying the producer's ``kv_transfer_params``; the consumer's answer
(JSON or an SSE stream) goes back to the client as it comes."""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, TypeVar

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from folovllm.proxy.pools import Backend, BackendPool
from folovllm.proxy.rewrite import CHAT, COMPLETIONS, check_body, decode_body, prefill_body

logger = logging.getLogger(__name__)

ROUTES = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}
# Headers of the client's request that reach the backends (the request id is set on its own).
FORWARDED_HEADERS = ("authorization",)
# Headers of a backend's answer that reach the client.
RELAYED_HEADERS = ("content-type", "retry-after")
CLIENT_GONE = 499  # nobody reads it: the client has left
T = TypeVar("T")


@dataclass(frozen=True)
class ProxyConfig:
    """Where the proxy sends requests and how long it waits for them."""

    prefill_urls: list[str]
    decode_urls: list[str]
    policy: str = "round_robin"
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 3600.0  # a gap between two chunks (or a whole prefill) longer than this fails
    health_timeout_s: float = 5.0
    pool_limits: httpx.Limits = field(default_factory=lambda: httpx.Limits(
        max_connections=None, max_keepalive_connections=256))  # a cap would queue requests in the proxy


def error_response(status: int, message: str, type: str, request_id: str | None = None) -> JSONResponse:
    """An OpenAI-style error body ({"error": {"message", "type", "param", "code"}})."""
    headers = {"X-Request-Id": request_id} if request_id else None
    return JSONResponse({"error": {"message": message, "type": type, "param": None, "code": status}},
                        status_code=status, headers=headers)


def upstream_failure(role: str, backend: Backend, err: httpx.HTTPError, request_id: str | None) -> JSONResponse:
    """502 (or 504 for a timeout) naming the instance that failed and how."""
    if isinstance(err, httpx.TimeoutException):
        return error_response(504, f"the {role} instance {backend.url} did not answer in time "
                                   f"({type(err).__name__})", "gateway_timeout", request_id)
    return error_response(502, f"the {role} instance {backend.url} is unreachable or broke the "
                               f"connection ({type(err).__name__}: {err})", "bad_gateway", request_id)


class ClientGone(Exception):
    """The client disconnected before the answer began."""


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(raw: Request, work: Awaitable[T]) -> T:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled (closing its
    upstream connection, so the backend aborts) and ClientGone is raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()


def _relayed_headers(upstream: httpx.Response, request_id: str) -> dict[str, str]:
    headers = {k: upstream.headers[k] for k in RELAYED_HEADERS if k in upstream.headers}
    headers["X-Request-Id"] = request_id
    return headers


async def _sse_chunks(upstream: httpx.Response, role: str, backend: Backend) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.HTTPError as err:  # the answer has begun: say so in the stream, as the server does
        message = f"the {role} instance {backend.url} broke the stream ({type(err).__name__}: {err})"
        yield f"data: {json.dumps({'error': {'message': message, 'type': 'bad_gateway', 'code': 502}})}\n\n".encode()


class RelayedStream(StreamingResponse):
    """A backend's stream passed through; however it ends (done, client gone, cancelled), the
    upstream stream is closed, so the backend sees the disconnect and aborts the request."""

    def __init__(self, upstream: httpx.Response, role: str, backend: Backend, request_id: str,
                 on_close: Callable[[], None]) -> None:
        super().__init__(_sse_chunks(upstream, role, backend), status_code=upstream.status_code,
                         headers=_relayed_headers(upstream, request_id))
        self.upstream, self.on_close = upstream, on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
            self.on_close()


class PDProxy:
    """The two pools, one HTTP client with pooled connections, and the relay of one request."""

    def __init__(self, config: ProxyConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.prefill = BackendPool("prefill", config.prefill_urls, config.policy)
        self.decode = BackendPool("decode", config.decode_urls, config.policy)
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        self.client = httpx.AsyncClient(timeout=timeout, limits=config.pool_limits, transport=transport)

    async def relay(self, raw: Request, endpoint: str) -> Response:
        request_id = raw.headers.get("x-request-id") or uuid.uuid4().hex
        try:
            body = check_body(json.loads(await raw.body()))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "the request body is not valid JSON.", "invalid_request_error", request_id)
        except ValueError as err:
            return error_response(400, str(err), "invalid_request_error", request_id)
        headers = {k: raw.headers[k] for k in FORWARDED_HEADERS if k in raw.headers}
        headers["X-Request-Id"] = request_id
        path = ROUTES[endpoint]
        try:
            prefilled = await unless_disconnected(raw, self._prefill(path, prefill_body(body, endpoint), headers))
            if isinstance(prefilled, Response):
                return prefilled
            return await self._decode(raw, path, decode_body(body, prefilled), headers,
                                      streamed=bool(body.get("stream")))
        except ClientGone:
            logger.info("request %s: the client left before the answer began", request_id)
            return Response(status_code=CLIENT_GONE)

    async def _prefill(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """The producer's ``kv_transfer_params`` (None when it returns none), or the response to
        send back as is: the producer's own error, or a 502/504."""
        request_id = headers["X-Request-Id"]
        backend = self.prefill.pick()
        with self.prefill.lease(backend):
            try:
                resp = await self.client.post(backend.url + path, json=body, headers=headers)
            except httpx.HTTPError as err:
                return upstream_failure("prefill", backend, err, request_id)
        if resp.status_code != 200:
            return Response(resp.content, status_code=resp.status_code, headers=_relayed_headers(resp, request_id))
        try:
            answer = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(502, f"the prefill instance {backend.url} answered 200 with a body that is "
                                       "not JSON", "bad_gateway", request_id)
        return answer.get("kv_transfer_params") if isinstance(answer, dict) else None

    async def _decode(self, raw: Request, path: str, body: dict[str, Any], headers: dict[str, str],
                      streamed: bool) -> Response:
        request_id = headers["X-Request-Id"]
        backend = self.decode.pick()
        backend.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released, backend.in_flight = True, backend.in_flight - 1

        try:
            request = self.client.build_request("POST", backend.url + path, json=body, headers=headers)
            upstream = await unless_disconnected(raw, self.client.send(request, stream=True))
        except httpx.HTTPError as err:
            release()
            return upstream_failure("decode", backend, err, request_id)
        except BaseException:
            release()
            raise
        if streamed and upstream.status_code == 200:
            return RelayedStream(upstream, "decode", backend, request_id, on_close=release)
        try:
            content = await unless_disconnected(raw, upstream.aread())
        except httpx.HTTPError as err:
            return upstream_failure("decode", backend, err, request_id)
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
            release()
        return Response(content, status_code=upstream.status_code, headers=_relayed_headers(upstream, request_id))

    async def models(self, raw: Request) -> Response:
        """GET /v1/models of the first decode instance that answers."""
        headers = {k: raw.headers[k] for k in FORWARDED_HEADERS if k in raw.headers}
        failures = []
        for backend in self.decode.backends:
            try:
                resp = await self.client.get(backend.url + "/v1/models", headers=headers)
            except httpx.HTTPError as err:
                failures.append(f"{backend.url}: {type(err).__name__}")
                continue
            return Response(resp.content, status_code=resp.status_code,
                            headers={k: resp.headers[k] for k in RELAYED_HEADERS if k in resp.headers})
        return error_response(502, f"no decode instance answered GET /v1/models ({'; '.join(failures)})",
                              "bad_gateway")

    async def health(self) -> JSONResponse:
        """200 when every instance answers GET /health with 200; 503 otherwise, naming each state."""
        pools = (self.prefill, self.decode)
        checks = [(pool.role, b) for pool in pools for b in pool.backends]
        states = await asyncio.gather(*(self._backend_health(b) for _, b in checks))
        report: dict[str, dict[str, str]] = {pool.role: {} for pool in pools}
        for (role, backend), state in zip(checks, states):
            report[role][backend.url] = state
        healthy = all(state == "ok" for state in states)
        return JSONResponse(report, status_code=200 if healthy else 503)

    async def _backend_health(self, backend: Backend) -> str:
        try:
            resp = await self.client.get(backend.url + "/health", timeout=self.config.health_timeout_s)
        except httpx.HTTPError as err:
            return f"unreachable ({type(err).__name__})"
        return "ok" if resp.status_code == 200 else f"HTTP {resp.status_code}"


def build_proxy_app(config: ProxyConfig, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The proxy's routes over ``config``'s pools; ``transport`` replaces the network (tests)."""
    proxy = PDProxy(config, transport)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await proxy.client.aclose()

    app = FastAPI(title="FoloVLLM PD proxy", lifespan=lifespan, redirect_slashes=False)
    app.state.proxy = proxy

    @app.post(ROUTES[COMPLETIONS])
    async def completions(raw: Request) -> Response:
        return await proxy.relay(raw, COMPLETIONS)

    @app.post(ROUTES[CHAT])
    async def chat_completions(raw: Request) -> Response:
        return await proxy.relay(raw, CHAT)

    @app.get("/v1/models")
    async def models(raw: Request) -> Response:
        return await proxy.models(raw)

    @app.get("/health")
    async def health() -> Response:
        return await proxy.health()

    return app
