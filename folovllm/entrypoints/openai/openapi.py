"""/openapi.json as this server answers: the request models' schemas with this server's limits filled in.

A request model states a limit it cannot know by itself as ``{LIMIT: {keyword: name}}`` (protocol.py);
here each becomes ``keyword: value`` from ``ServerLimits`` (a token id's maximum is the vocabulary's last
id, a prompt list's maxItems the server's --max-prompts-per-request, ...). A feature this server has off
turns its field's schema to null: the only value it takes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from folovllm.entrypoints.openai.protocol import LIMIT


# How a route's success is documented where it is not JSON (pass as the route's responses, with
# response_class=Response, so that its errors stay documented as JSON):
# JSON, or with "stream": true server-sent events (each as OpenAPI 3.2's itemSchema describes one)
_SSE_EVENT = {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                                               "id": {"type": "string"}, "retry": {"type": "integer", "minimum": 0}}}
STREAMED = {200: {"content": {"text/event-stream": {"itemSchema": _SSE_EVENT}}}}
TEXT_OK = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}}}
EMPTY_OK = {200: {"description": "an empty body"}}


@dataclass(frozen=True)
class ServerLimits:
    """The limits a request body meets on this server (the names ``LIMIT`` keywords use)."""

    max_token_id: int  # the vocabulary's last id
    max_model_len: int
    max_prompt_chars: int  # a text longer than this cannot fit max_model_len tokens
    max_n: int
    max_prompts: int
    max_stop_strings: int
    max_stop_string_chars: int
    # features a field needs, on or off here: off, the field takes null alone
    kv_transfer_params: bool = False  # --kv-role
    request_chat_template: bool = False  # --trust-request-chat-template


def server_openapi(app: FastAPI, limits: ServerLimits) -> Callable[[], dict[str, Any]]:
    """``app.openapi``: FastAPI's schema of the app's routes with ``limits`` filled in, built once."""
    values = asdict(limits)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, openapi_version=app.openapi_version,
                                 description=app.description, routes=app.routes)
            app.openapi_schema = _fill(schema, values)
        return app.openapi_schema

    return openapi


def _fill(node: Any, values: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_fill(item, values) for item in node]
    if not isinstance(node, dict):
        return node
    filled = {key: _fill(value, values) for key, value in node.items() if key != LIMIT}
    for keyword, name in node.get(LIMIT, {}).items():
        if keyword == "type":  # a feature: null alone while it is off
            if not values[name]:
                return {"type": "null", "description": f"{name} is off on this server"}
        else:
            filled[keyword] = values[name]
    return filled
