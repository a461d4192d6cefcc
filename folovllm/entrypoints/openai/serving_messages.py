"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path.

A Messages request is read as one chat request (``protocol_messages``), so it is rendered, admitted,
constrained (tool_choice ``any``/``tool`` force a schema-valid ``tool_use`` block) and parsed exactly
as chat completions are; the reply's blocks (``reply_blocks``) are written as Anthropic's content
blocks. A stream is Anthropic's event sequence: message_start, ping, then per block
content_block_start, content_block_delta (text_delta, thinking_delta, input_json_delta),
content_block_stop, then message_delta (stop reason, usage) and message_stop; an engine failure ends it
with an ``error`` event. Errors on these paths, whichever layer gives them, leave in Anthropic's error
shape (``AnthropicErrorShape``).
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from folovllm.engine.async_engine import EngineError
from folovllm.entrypoints.openai.chat_reply import ReplyDeltas
from folovllm.entrypoints.openai.errors import bad_request, error_responses
from folovllm.entrypoints.openai.middleware import route_path
from folovllm.entrypoints.openai.openapi import STREAMED
from folovllm.entrypoints.openai.protocol import UnsupportedField
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.protocol_messages import CountTokensRequest, MessagesRequest, _Conversation
from folovllm.entrypoints.openai.protocol_messages_out import (
    AnthropicErrorBody,
    AnthropicMessageOut,
    CountTokensOut,
    anthropic_error,
)
from folovllm.entrypoints.openai.reply_blocks import BlockEvent, BlockStream, ReplyBlock, reply_blocks
from folovllm.entrypoints.openai.serving import ServingContext, TextDeltas, engine_error, request_id_of
from folovllm.entrypoints.openai.serving_chat import ChatRun, ChatServing
from folovllm.entrypoints.openai.tool_parsers.base import loads_partial
from folovllm.outputs import RequestOutput

MESSAGES_PATH = "/v1/messages"
# chat's field names as this API calls them, for the errors the chat path gives
_NAMES = {"stop": "stop_sequences", "response_format": "output_config.format", "structured_outputs": "tools"}


class MessagesServing:
    def __init__(self, ctx: ServingContext, chat: ChatServing) -> None:
        self.ctx = ctx
        self.chat = chat

    async def create(self, body: MessagesRequest, raw: Request):
        arrival, request_id = time.perf_counter(), request_id_of(raw, "msg_")
        run = await self.chat.start(self._as_chat(body, body.sampling()), request_id, arrival, _NAMES)
        if body.stream:
            return StreamingResponse(self._events(run, request_id), media_type="text/event-stream")
        final = (await self.ctx.collect([run.stream], raw))[0]
        out = final.outputs[0]
        message, _ = run.reader.message(out.text, out.finish_reason)
        blocks = reply_blocks(message)
        stop_reason, stop_sequence = _stop_reason(blocks, final)
        return JSONResponse({**_message(request_id, run.model, [_content(b) for b in blocks], stop_reason,
                                        stop_sequence),
                             "usage": _usage(final)})

    async def count_tokens(self, body: CountTokensRequest) -> dict:
        """The prompt tokens a Messages request with this conversation, tools and system would have."""
        ids = await self.chat.prompt_ids(self._as_chat(body, None), _NAMES)
        return {"input_tokens": len(ids)}

    def _as_chat(self, body: _Conversation, sampling: dict | None) -> ChatCompletionRequest:
        """The chat request ``body`` reads as; ``sampling`` None: it only counts tokens."""
        try:
            body.check_supported()
        except UnsupportedField as err:
            raise bad_request(err, err.param) from err
        auto = body.tools and (body.tool_choice is None or body.tool_choice.type == "auto")
        if auto and sampling is not None and not self.ctx.validator.chat_settings.enable_auto_tool_choice:
            raise bad_request('tool_choice {"type": "auto"} (the default when tools are given) needs the server '
                              "started with --enable-auto-tool-choice and --tool-call-parser NAME; use "
                              '{"type": "any"}, {"type": "tool", "name": ...} or {"type": "none"}', "tool_choice")
        try:
            return body.to_chat(**(sampling or {}))
        except ValueError as err:
            raise bad_request(err, "messages") from err

    async def _events(self, run: ChatRun, request_id: str) -> AsyncIterator[str]:
        cursor, replies, blocks = TextDeltas(run.stop), ReplyDeltas(run.reader), BlockStream()
        final: RequestOutput | None = None
        try:
            async for output in run.stream:
                if final is None:  # the first output knows the prompt tokens served from the prefix cache
                    yield _event("message_start", message={**_message(request_id, run.model, [], None, None),
                                                           "usage": _usage(output, generated=0)})
                    yield _event("ping")
                final = output
                out = output.outputs[0]
                text, _ = cursor.advance(out)
                for event in blocks.advance(replies.advance(text, out.finished())):
                    yield _block_event(event)
        except EngineError as err:
            error = engine_error(err)
            yield _event("error", error=anthropic_error(error.status_code, error.message)["error"])
            return
        finally:
            self.ctx.abort_unfinished([run.stream])
        for event in blocks.finish():
            yield _block_event(event)
        stop_reason, stop_sequence = _stop_reason(blocks.blocks, final)
        yield _event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                     usage=_usage(final))
        yield _event("message_stop")


def add_messages_routes(v1: APIRouter, serving: MessagesServing,
                        handle: Callable[[Awaitable], Awaitable]) -> None:
    """``/messages`` and ``/messages/count_tokens`` on the /v1 router (its API key check included)."""
    errors = error_responses(AnthropicErrorBody)

    async def create_message(body: MessagesRequest, raw: Request):
        return await handle(serving.create(body, raw))

    async def count_message_tokens(body: CountTokensRequest) -> dict:
        return await serving.count_tokens(body)

    shown = not serving.ctx.engine.info.pooling  # a pooling engine answers each with an error
    v1.add_api_route("/messages", create_message, methods=["POST"], response_model=AnthropicMessageOut,
                     responses={**STREAMED, **errors}, summary="Anthropic's Messages API", include_in_schema=shown)
    v1.add_api_route("/messages/count_tokens", count_message_tokens, methods=["POST"],
                     response_model=CountTokensOut, responses=errors, summary="Anthropic's token count",
                     include_in_schema=shown)


def anthropic_shaped(request: Request, response: JSONResponse) -> JSONResponse:
    """An error response as the Messages API's paths give it (``install_error_handlers``' reshape)."""
    if not _messages_path(route_path(request.scope)):
        return response
    return JSONResponse(json.loads(_reshaped(response.status_code, response.body)), response.status_code,
                        headers={k: v for k, v in response.headers.items() if k.lower() != "content-length"})


def _messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


class AnthropicErrorShape:
    """ASGI middleware: an error response on the Messages API's paths, whichever layer gave it (the
    body check, the API key, the drain gate, the router), leaves in Anthropic's shape, with its status."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not _messages_path(route_path(scope)):
            await self.app(scope, receive, send)
            return
        held: dict | None = None  # an error's response start, sent once its body is reshaped
        chunks: list[bytes] = []

        async def reshaping_send(message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = _reshaped(held["status"], b"".join(chunks))
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
            await send({**held, "headers": headers + [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshaping_send)


def _reshaped(status: int, body: bytes) -> bytes:
    """An OpenAI error body as Anthropic's; anything else as it is."""
    try:
        error = json.loads(body)["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        return body
    return json.dumps(anthropic_error(status, message)).encode()


def _event(kind: str, **fields) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, separators=(',', ':'))}\n\n"


def _block_event(event: BlockEvent) -> str:
    block, index = event.block, event.index
    if event.kind == "start":
        started = {"reasoning": {"type": "thinking", "thinking": "", "signature": ""},
                   "text": {"type": "text", "text": ""}}.get(block.kind) or \
            {"type": "tool_use", "id": block.call_id, "name": block.name, "input": {}}
        return _event("content_block_start", index=index, content_block=started)
    if event.kind == "delta":
        delta = {"reasoning": {"type": "thinking_delta", "thinking": event.delta},
                 "text": {"type": "text_delta", "text": event.delta}}.get(block.kind) or \
            {"type": "input_json_delta", "partial_json": event.delta}
        return _event("content_block_delta", index=index, delta=delta)
    return _event("content_block_stop", index=index)


def _content(block: ReplyBlock) -> dict:
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": block.text, "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": block.text}
    try:
        arguments = json.loads(block.text)
    except ValueError:
        arguments = loads_partial(block.text)  # as far as it arrived when max_tokens cut the call
    if not isinstance(arguments, dict):  # not a call's input object: what the model wrote stays text
        return {"type": "text", "text": block.text}
    return {"type": "tool_use", "id": block.call_id, "name": block.name, "input": arguments}


def _message(request_id: str, model: str, content: list[dict], stop_reason: str | None,
             stop_sequence: str | None) -> dict:
    """A message's fields but its usage; ``model``: the name it reports (``ChatRun.model``)."""
    return {"id": request_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence}


def _stop_reason(blocks: list[ReplyBlock], final: RequestOutput) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished reply."""
    out = final.outputs[0]
    if out.finish_reason == "length":
        return "max_tokens", None
    if any(block.kind == "tool_call" for block in blocks):
        return "tool_use", None
    if isinstance(out.stop_reason, str):
        return "stop_sequence", out.stop_reason
    return "end_turn", None


def _usage(output: RequestOutput, generated: int | None = None) -> dict:
    """Anthropic's usage: input_tokens are the prompt tokens not read from the prefix cache."""
    cached = output.num_cached_tokens
    return {"input_tokens": len(output.prompt_token_ids) - cached, "cache_read_input_tokens": cached,
            "output_tokens": len(output.outputs[0].token_ids) if generated is None else generated}
