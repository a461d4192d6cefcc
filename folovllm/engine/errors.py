"""Why a request ended without its output, as the server reports it (status, OpenAI type and code).

The server turns any of these into an OpenAI error body: a JSON response, or a stream's last event.
"""
from __future__ import annotations


class EngineError(RuntimeError):
    """A request ended because of the engine, not because of the client's input."""

    status_code = 500
    error_type = "internal_error"
    code = "internal_error"


class RequestFailedError(EngineError):
    """The engine failed while computing this request; it alone was ended, the others go on."""

    def __init__(self, message: str = "the engine failed while generating this request; "
                                      "see the server log") -> None:
        super().__init__(message)


class RequestRefusedError(EngineError):
    """The request's own settings left it nothing to generate (its structured-outputs constraint refused
    the token its other settings allowed, e.g. a stop token banned by min_tokens): the client's to change."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "unsatisfiable_constraint"


class EngineDeadError(EngineError):
    """The engine core is gone (its process died or its loop failed); the server exits soon."""

    code = "engine_dead"


class EngineShutdownError(EngineError):
    """The server is shutting down (SIGTERM, drain timeout) before the request finished."""

    status_code = 503
    error_type = "service_unavailable"
    code = "shutting_down"
