"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API over the chat path.

A request (its stored history first, with ``previous_response_id``) is read as one chat request
(``protocol_responses``), so it is rendered, admitted, constrained (``tool_choice`` "required" or a
named function, ``text.format``) and parsed as chat completions are; the reply's blocks
(``reply_blocks``) become output items: ``reasoning`` (with a reasoning parser), ``message``,
``function_call``. With ``store`` the response and its conversation are kept (``responses_store``).

A stream is the API's typed events, numbered by ``sequence_number``: response.created,
response.in_progress, then per item response.output_item.added, its deltas
(response.content_part.added + response.output_text.delta / response.reasoning_text.delta, or
response.function_call_arguments.delta), their done events and response.output_item.done, then
response.completed (its response's status "incomplete" when max_output_tokens cut it: the openai
client's stream helper waits for this event whatever the status); an engine failure ends it with an
``error`` event.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from folovllm.engine.async_engine import EngineError
from folovllm.entrypoints.openai.chat_reply import ReplyDeltas
from folovllm.entrypoints.openai.errors import APIError, ErrorResponse, bad_request
from folovllm.entrypoints.openai.openapi import STREAMED
from folovllm.entrypoints.openai.protocol import UnsupportedField
from folovllm.entrypoints.openai.protocol_responses import INPUT_ITEMS, ResponsesRequest
from folovllm.entrypoints.openai.protocol_responses_out import DeletedResponseOut, ResponseOut
from folovllm.entrypoints.openai.reply_blocks import BlockEvent, BlockStream, ReplyBlock, reply_blocks
from folovllm.entrypoints.openai.responses_store import ResponseStore
from folovllm.entrypoints.openai.serving import ServingContext, TextDeltas, engine_error, now_s, request_id_of
from folovllm.entrypoints.openai.serving_chat import ChatRun, ChatServing
from folovllm.outputs import RequestOutput

# chat's field names as this API calls them, for the errors the chat path gives
_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
          "structured_outputs": "tools"}
_ID_PREFIXES = {"reasoning": "rs_", "text": "msg_", "tool_call": "fc_"}


class ResponsesServing:
    def __init__(self, ctx: ServingContext, chat: ChatServing, store: ResponseStore) -> None:
        self.ctx = ctx
        self.chat = chat
        self.store = store

    async def create(self, body: ResponsesRequest, raw: Request):
        arrival, response_id = time.perf_counter(), request_id_of(raw, "resp_")
        try:
            body.check_supported()
        except UnsupportedField as err:
            raise bad_request(err, err.param) from err
        if body.store and not self.store.enabled:
            raise bad_request("this server keeps no responses (it runs with --max-stored-responses 0); "
                              "set store to false", "store")
        history = self._history(body.previous_response_id)
        try:
            items = body.items()
            chat_body = body.to_chat(history)
        except ValueError as err:
            raise bad_request(err, "input") from err
        run = await self.chat.start(chat_body, response_id, arrival, _NAMES)
        draft = _Draft(body, response_id, run.model, self.store.enabled if body.store is None else body.store)
        conversation = history + items
        if body.stream:
            return StreamingResponse(self._events(draft, run, conversation), media_type="text/event-stream")
        final = (await self.ctx.collect([run.stream], raw))[0]
        out = final.outputs[0]
        message, _ = run.reader.message(out.text, out.finish_reason)
        blocks = reply_blocks(message)
        output = draft.items(blocks, [_new_id(b) for b in blocks], out.finish_reason)
        return JSONResponse(await self._finish(draft, final, blocks, output, conversation))

    async def retrieve(self, response_id: str, stream: bool = False) -> dict:
        """A stored response (``stream`` is not offered: the response is given whole)."""
        if stream:
            raise bad_request("a stored response is given whole; GET it without stream=true", "stream")
        return self._stored(response_id, "response_id").response

    async def delete(self, response_id: str) -> dict:
        self._stored(response_id, "response_id")
        self.store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    def _history(self, previous_response_id: str | None) -> list:
        if previous_response_id is None:
            return []
        return self._stored(previous_response_id, "previous_response_id").items

    def _stored(self, response_id: str, param: str):
        stored = self.store.get(response_id)
        if stored is None:
            store = self.store
            raise APIError(404, f"no stored response has the id {response_id!r}: it was not stored (store: "
                                f"false), was deleted, or is gone (this server keeps at most {store.max_count} "
                                f"responses, each for {store.ttl_s:g} s)", type="invalid_request_error",
                           param=param, code="response_not_found")
        return stored

    async def _finish(self, draft: _Draft, final: RequestOutput, blocks: list[ReplyBlock], output: list[dict],
                      conversation: list) -> dict:
        """The finished response object; kept when the request asked for it."""
        reasoning = "".join(block.text for block in blocks if block.kind == "reasoning")
        reasoning_tokens = len(await self.ctx.off_loop(self.ctx.validator.encode, reasoning, False, "reasoning")
                               ) if reasoning else 0
        response = draft.response(output, final, reasoning_tokens)
        if draft.store:
            self.store.put(draft.response_id, response, conversation + INPUT_ITEMS.validate_python(output))
        return response

    async def _events(self, draft: _Draft, run: ChatRun, conversation: list) -> AsyncIterator[str]:
        sequence = 0

        def event(kind: str, **fields) -> str:
            nonlocal sequence
            payload = {"type": kind, "sequence_number": sequence, **fields}
            sequence += 1
            return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"

        yield event("response.created", response=draft.response([], None))
        yield event("response.in_progress", response=draft.response([], None))
        cursor, replies, blocks = TextDeltas(run.stop), ReplyDeltas(run.reader), BlockStream()
        ids: list[str] = []
        final: RequestOutput | None = None
        try:
            async for output in run.stream:
                final = output
                out = output.outputs[0]
                text, _ = cursor.advance(out)
                for block_event in blocks.advance(replies.advance(text, out.finished())):
                    if block_event.kind == "start":
                        ids.append(_new_id(block_event.block))
                    for kind, fields in draft.events(block_event, ids[block_event.index], "completed"):
                        yield event(kind, **fields)
        except EngineError as err:
            error = engine_error(err)
            yield event("error", code=error.code or error.type, message=error.message, param=None)
            return
        finally:
            self.ctx.abort_unfinished([run.stream])
        finish_reason = final.outputs[0].finish_reason
        for block_event in blocks.finish():
            for kind, fields in draft.events(block_event, ids[block_event.index], _last_status(finish_reason)):
                yield event(kind, **fields)
        output = draft.items(blocks.blocks, ids, finish_reason)
        yield event("response.completed", response=await self._finish(draft, final, blocks.blocks, output,
                                                                        conversation))


def add_responses_routes(v1: APIRouter, serving: ResponsesServing,
                         handle: Callable[[Awaitable], Awaitable]) -> None:
    """``/responses`` (create), ``/responses/{id}`` (GET, DELETE) on the /v1 router; in /openapi.json on a
    generating engine alone (a pooling one answers each with an error)."""
    shown = not serving.ctx.engine.info.pooling
    not_found = {404: {"model": ErrorResponse, "description": "no stored response has this id"}}

    async def create_response(body: ResponsesRequest, raw: Request):
        return await handle(serving.create(body, raw))

    async def retrieve_response(response_id: str, stream: bool = Query(False, json_schema_extra={"const": False})):
        return await serving.retrieve(response_id, stream)  # stream=true is a 400 that says why

    v1.add_api_route("/responses", create_response, methods=["POST"], response_model=ResponseOut,
                     responses=STREAMED, summary="Create a response", include_in_schema=shown)
    v1.add_api_route("/responses/{response_id}", retrieve_response, methods=["GET"], response_model=ResponseOut,
                     responses=not_found, summary="A stored response", include_in_schema=shown)
    v1.add_api_route("/responses/{response_id}", serving.delete, methods=["DELETE"],
                     response_model=DeletedResponseOut, responses=not_found, summary="Delete a stored response",
                     include_in_schema=shown)


def _new_id(block: ReplyBlock) -> str:
    return _ID_PREFIXES[block.kind] + uuid.uuid4().hex


def _last_status(finish_reason: str | None) -> str:
    """The last item's status: "incomplete" when max_output_tokens cut it."""
    return "incomplete" if finish_reason == "length" else "completed"


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class _Draft:
    """What every snapshot of one response shares: the request it answers, its id, its settings."""

    def __init__(self, body: ResponsesRequest, response_id: str, model: str, store: bool) -> None:
        self.body = body
        self.response_id = response_id
        self.created = now_s()
        self.model = model
        self.store = store

    def item(self, block: ReplyBlock, item_id: str, status: str) -> dict:
        """The output item of a block; one in progress holds nothing yet."""
        done = status != "in_progress"
        if block.kind == "reasoning":
            return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
                    "content": [{"type": "reasoning_text", "text": block.text}] if done else []}
        if block.kind == "text":
            return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                    "content": [_text_part(block.text)] if done else []}
        return {"type": "function_call", "id": item_id, "call_id": block.call_id, "name": block.name,
                "arguments": block.text if done else "", "status": status}

    def items(self, blocks: list[ReplyBlock], ids: list[str], finish_reason: str | None) -> list[dict]:
        last = len(blocks) - 1
        return [self.item(block, ids[i], _last_status(finish_reason) if i == last else "completed")
                for i, block in enumerate(blocks)]

    def events(self, event: BlockEvent, item_id: str, status: str) -> list[tuple[str, dict]]:
        """The stream events (type, fields) of one block event; ``status``: the item's, once stopped."""
        block = event.block
        where = {"item_id": item_id, "output_index": event.index}
        part = {"item_id": item_id, "output_index": event.index, "content_index": 0}
        if event.kind == "start":
            added = [("response.output_item.added", {"output_index": event.index,
                                                     "item": self.item(block, item_id, "in_progress")})]
            if block.kind == "reasoning":
                added.append(("response.content_part.added", {**part, "part": {"type": "reasoning_text", "text": ""}}))
            elif block.kind == "text":
                added.append(("response.content_part.added", {**part, "part": _text_part("")}))
            return added
        if event.kind == "delta":
            if block.kind == "reasoning":
                return [("response.reasoning_text.delta", {**part, "delta": event.delta})]
            if block.kind == "text":
                return [("response.output_text.delta", {**part, "delta": event.delta, "logprobs": []})]
            return [("response.function_call_arguments.delta", {**where, "delta": event.delta})]
        item = self.item(block, item_id, status)
        done = [("response.output_item.done", {"output_index": event.index, "item": item})]
        if block.kind == "reasoning":
            return [("response.reasoning_text.done", {**part, "text": block.text}),
                    ("response.content_part.done", {**part, "part": item["content"][0]})] + done
        if block.kind == "text":
            return [("response.output_text.done", {**part, "text": block.text, "logprobs": []}),
                    ("response.content_part.done", {**part, "part": item["content"][0]})] + done
        return [("response.function_call_arguments.done", {**where, "arguments": block.text})] + done

    def response(self, output: list[dict], final: RequestOutput | None, reasoning_tokens: int = 0) -> dict:
        """The response object: in progress (no ``final`` yet), completed, or incomplete (cut at
        max_output_tokens)."""
        body = self.body
        status, incomplete, usage = "in_progress", None, None
        if final is not None:
            out = final.outputs[0]
            status = _last_status(out.finish_reason)
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
            prompt_tokens, output_tokens = len(final.prompt_token_ids), len(out.token_ids)
            usage = {"input_tokens": prompt_tokens,
                     "input_tokens_details": {"cached_tokens": final.num_cached_tokens},
                     "output_tokens": output_tokens,
                     "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                     "total_tokens": prompt_tokens + output_tokens}
        fmt = body.text.format if body.text is not None else None
        choice = body.tool_choice
        return {"id": self.response_id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "instructions": body.instructions,
                "max_output_tokens": body.max_output_tokens, "temperature": body.temperature,
                "top_p": body.top_p, "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or ()],
                "tool_choice": choice.model_dump() if hasattr(choice, "model_dump") else choice or "auto",
                "parallel_tool_calls": body.parallel_tool_calls is not False,
                "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
                "truncation": "disabled", "store": self.store, "previous_response_id": body.previous_response_id,
                "metadata": body.metadata or {}, "user": body.user, "error": None,
                "incomplete_details": incomplete, "usage": usage}
