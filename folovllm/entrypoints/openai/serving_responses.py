"""POST /v1/responses: OpenAI's Responses API for text generation, streamed as its typed events.

The input (a string, or a list of messages) goes through the chat template after ``instructions``
as a system message; the answer is one assistant message with one ``output_text`` part. Nothing is
stored and there are no tools: fields that need them are a 400 that names them.

A stream is a sequence of typed events (SSE ``event:`` + ``data:``), numbered by ``sequence_number``:
response.created, response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta (repeated), response.output_text.done, response.content_part.done,
response.output_item.done, then response.completed (its response's status "incomplete" when
max_output_tokens cut it); an engine failure ends it with an ``error`` event.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from folovllm.engine.async_engine import EngineError, RequestStream
from folovllm.entrypoints.openai.protocol_responses import ResponsesRequest
from folovllm.entrypoints.openai.serving import ServingContext, TextDeltas, engine_error, now_s, request_id_of
from folovllm.outputs import RequestOutput


class ResponsesServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, body: ResponsesRequest, raw: Request):
        arrival = time.perf_counter()
        ctx = self.ctx
        lora = ctx.check_model(body.model)
        prompt, params = await ctx.off_loop(ctx.validator.responses, body)
        response_id = request_id_of(raw, "resp_")
        streams = await ctx.start([prompt], params, response_id, arrival,
                                  {"max_tokens": "max_output_tokens"}, prompt_param="input", user=body.user,
                                  lora_request=lora)
        draft = _Draft(body, response_id, f"msg_{uuid.uuid4().hex}", now_s(), ctx.reported_model(lora))
        if body.stream:
            return StreamingResponse(self._events(draft, streams[0]), media_type="text/event-stream")
        final = (await ctx.collect(streams, raw))[0]
        return JSONResponse(draft.response(final, final.outputs[0].text, ctx))

    async def _events(self, draft: _Draft, stream: RequestStream) -> AsyncIterator[str]:
        sequence = 0

        def event(kind: str, **fields) -> str:
            nonlocal sequence
            payload = {"type": kind, "sequence_number": sequence, **fields}
            sequence += 1
            return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"

        where = {"item_id": draft.message_id, "output_index": 0}
        yield event("response.created", response=draft.response(None, None, self.ctx))
        yield event("response.in_progress", response=draft.response(None, None, self.ctx))
        yield event("response.output_item.added", output_index=0, item=draft.message("", "in_progress"))
        yield event("response.content_part.added", **where, content_index=0, part=_text_part(""))
        cursor, final = TextDeltas([]), None
        try:
            async for output in stream:
                final = output
                delta, _ = cursor.advance(output.outputs[0])
                if delta:
                    yield event("response.output_text.delta", **where, content_index=0, delta=delta,
                                logprobs=[])
        except EngineError as err:
            error = engine_error(err)
            yield event("error", code=error.code or error.type, message=error.message, param=None)
            return
        finally:
            self.ctx.abort_unfinished([stream])
        text = final.outputs[0].text
        yield event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
        yield event("response.content_part.done", **where, content_index=0, part=_text_part(text))
        yield event("response.output_item.done", output_index=0, item=draft.message(text, "completed"))
        # "completed" also when max_output_tokens cut it: the response's status says so, and clients
        # (the openai SDK's stream helper) wait for this event whatever the status
        yield event("response.completed", response=draft.response(final, text, self.ctx))


class _Draft:
    """What every snapshot of one response shares."""

    def __init__(self, body: ResponsesRequest, response_id: str, message_id: str, created: int,
                 model: str) -> None:
        self.body = body
        self.response_id = response_id
        self.message_id = message_id
        self.created = created
        self.model = model

    def message(self, text: str, status: str) -> dict:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [_text_part(text)] if status == "completed" else []}

    def response(self, final: RequestOutput | None, text: str | None, ctx: ServingContext) -> dict:
        """The response object: in progress (no ``final`` yet), completed, or incomplete (cut at
        max_output_tokens)."""
        body = self.body
        status, incomplete, usage, output = "in_progress", None, None, []
        if final is not None:
            out = final.outputs[0]
            status = "incomplete" if out.finish_reason == "length" else "completed"
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
            output = [self.message(text, "completed")]
            prompt_tokens, completion_tokens = len(final.prompt_token_ids), len(out.token_ids)
            usage = {"input_tokens": prompt_tokens,
                     "input_tokens_details": {"cached_tokens": final.num_cached_tokens},
                     "output_tokens": completion_tokens,
                     "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": prompt_tokens + completion_tokens}
        return {"id": self.response_id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "instructions": body.instructions,
                "max_output_tokens": body.max_output_tokens, "temperature": body.temperature,
                "top_p": body.top_p, "tools": [], "tool_choice": "none", "parallel_tool_calls": False,
                "text": {"format": {"type": "text"}}, "truncation": "disabled", "store": False,
                "metadata": body.metadata or {}, "user": body.user, "error": None,
                "incomplete_details": incomplete, "usage": usage}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
