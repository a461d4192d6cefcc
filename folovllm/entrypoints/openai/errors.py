"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}} with the right status."""
from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

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
    """A 400 from a validation message; the parameter is read from the message when not given."""
    message = str(err)
    if param is None:
        match = _PARAM_IN_MESSAGE.match(message)
        param = match.group(1) if match else None
    if param is not None and renames:
        param = renames.get(param, param)
    return APIError(400, message, param=param)


def server_busy(retry_after_s: int = 1) -> APIError:
    return APIError(503, "the server is at capacity: too many requests are waiting; retry later",
                    type="service_unavailable", code="server_busy",
                    headers={"Retry-After": str(retry_after_s)})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def _schema_error(_: Request, err: RequestValidationError) -> JSONResponse:
        # Malformed JSON and schema mismatches are the client's 400, not FastAPI's default 422.
        first = err.errors()[0] if err.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message, param = f"the request body is not valid JSON: {first.get('msg', '')}", None
        else:
            where = ".".join(loc) or "body"
            message, param = f"{where}: {first.get('msg', 'invalid value')}", (loc[0] if loc else None)
        return APIError(400, message, param=param).response()
