"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}} with the right status."""
from __future__ import annotations

import logging
import re

from collections.abc import Callable, Iterable
from typing import Any

import fastapi.routing
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match

logger = logging.getLogger(__name__)

_PARAM_IN_MESSAGE = re.compile(r"^(\w+) must be")  # SamplingParams' "top_p must be in (0, 1], ..."


class APIError(Exception):
    """An error the client caused (or must wait out); becomes a JSON error response."""

    def __init__(self, status_code: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def bad_request(err: ValueError | str, param: str | None = None,
                renames: dict[str, str] | None = None) -> APIError:
    """A 400 from a validation message; the parameter is read from the message when not given.
    ``renames`` maps the engine's names to the request's (max_tokens -> max_completion_tokens)."""
    message = str(err)
    match = _PARAM_IN_MESSAGE.match(message)
    if match and renames and match.group(1) in renames:
        message = renames[match.group(1)] + message[len(match.group(1)):]
        match = _PARAM_IN_MESSAGE.match(message)
    if param is None:
        param = match.group(1) if match else None
    if param is not None and renames:
        param = renames.get(param, param)
    return APIError(400, message, param=param)


def server_busy(retry_after_s: int = 1) -> APIError:
    return APIError(503, "the server is at capacity: too many requests are waiting; retry later",
                    type="service_unavailable", code="server_busy",
                    headers={"Retry-After": str(retry_after_s)})


def request_too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes (this server's "
                         "--max-request-body-bytes)", code="request_too_large")


_HTTP_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The body of every error response (OpenAI's and vLLM's shape)."""

    error: ErrorDetail


def error_responses(body: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """What a route documents besides its success: a body the server refuses is a 400 (never FastAPI's
    422); any other error status (401, 404, 413, 503, 500, ...) carries the same ``body``."""
    return {400: {"model": body, "description": "the request is invalid (malformed JSON, a field out of its range "
                                                "or a value this server refuses)"},
            "default": {"model": body, "description": "any other error: 401 (API key), 404 (no such model or "
                                                      "path), 413 (body too large), 503 (busy or shutting down), "
                                                      "500 (engine failure)"}}


ERROR_RESPONSES = error_responses(ErrorResponse)  # every route's, but the Messages API's (Anthropic's shape)


def install_error_handlers(app: FastAPI,
                           reshape: Callable[[Request, JSONResponse], JSONResponse] | None = None) -> None:
    """Every error leaves the server as an OpenAI error body, whatever raised it. ``reshape``: for the
    unexpected errors, answered outside every middleware, the error body a path gives instead (the
    Messages API's middleware reshapes the others)."""
    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
        # Unknown paths and wrong methods: the router's 404 / 405, in the same shape as ours.
        message = f"{request.method} {request.url.path}: {err.detail}"
        error_type = _HTTP_ERROR_TYPES.get(err.status_code, "invalid_request_error")
        headers = getattr(err, "headers", None)
        if err.status_code == 405:  # the router names only the first route of the path
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
        return APIError(err.status_code, message, type=error_type, headers=headers).response()

    @app.exception_handler(RequestValidationError)
    async def _schema_error(_: Request, err: RequestValidationError) -> JSONResponse:
        # Malformed JSON and schema mismatches are the client's 400, not FastAPI's default 422.
        errors = err.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message, param = f"the request body is not valid JSON: {first.get('msg', '')}", None
        else:
            where = _field_path(loc) or "body"
            detail = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
            message, param = f"{where}: {detail}", (loc[0] if loc else None)
        return APIError(400, message, param=param).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        if isinstance(err, RecursionError):  # JSON nested deeper than the parser goes
            error = APIError(400, "the request body is nested too deeply")
        else:
            logger.exception("unexpected error on %s %s", request.method, request.url.path)
            error = APIError(500, f"internal server error: {type(err).__name__}", type="internal_error",
                             code="internal_error")
        return reshape(request, error.response()) if reshape is not None else error.response()


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the request's path takes (a path may have one route per method)."""
    methods: set[str] = set()
    for route in app_routes(request.app):
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def app_routes(app: FastAPI) -> Iterable[Any]:
    """The app's routes, those of included routers one by one (FastAPI from 0.16x includes a router as one
    lazy route that ``iter_route_contexts`` opens)."""
    iterate = getattr(fastapi.routing, "iter_route_contexts", None)
    return app.routes if iterate is None else iterate(app.routes)


def _field_path(loc: list[str]) -> str:
    """``messages.0.content`` as ``messages[0].content``; pydantic's union-member tags dropped."""
    parts: list[str] = []
    for part in loc:
        if part.isdigit() and parts:
            parts[-1] += f"[{part}]"
        elif "[" in part or part in ("str", "int", "float", "bool", "function-after"):
            continue
        else:
            parts.append(part)
    return ".".join(parts)
