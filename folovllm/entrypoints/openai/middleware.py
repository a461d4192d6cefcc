"""ASGI middlewares of the server's frontend: request ids and the in-flight load count.

Plain ASGI classes (not BaseHTTPMiddleware, which would wrap every streamed chunk in a task).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from folovllm.entrypoints.openai.errors import APIError
from folovllm.entrypoints.openai.serving import REQUEST_ID

MAX_REQUEST_ID_CHARS = 256
# The routes that run generation: their in-flight requests are the server's load (GET /load).
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/invocations")


def route_path(scope) -> str:
    """The path the router matches: without the app's ``--root-path`` prefix, if it carries one."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root + "/") else path


class RequestIdHeader:
    """Takes the request's id from its ``X-Request-Id`` header (else makes one), keeps it in the
    ASGI scope for the endpoints, and echoes it in the response's ``X-Request-Id`` header."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        if given is not None and len(given) > MAX_REQUEST_ID_CHARS:
            error = APIError(400, f"the X-Request-Id header must be at most {MAX_REQUEST_ID_CHARS} "
                                  "characters", param="X-Request-Id")
            await error.response()(scope, receive, send)
            return
        request_id = given.decode("latin-1") if given else uuid.uuid4().hex
        scope[REQUEST_ID] = request_id

        async def echoing_send(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": headers + [(b"x-request-id", request_id.encode("latin-1"))]}
            await send(message)

        await self.app(scope, receive, echoing_send)


@dataclass
class InFlight:
    count: int = 0


class ServerLoad:
    """Counts the generation requests in flight, from arrival until their response (streamed or
    not) has been sent: vLLM's server-load figure, served by GET /load."""

    def __init__(self, app, load: InFlight) -> None:
        self.app = app
        self.load = load

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or route_path(scope) not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        self.load.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.load.count -= 1
