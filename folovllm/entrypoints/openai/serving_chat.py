"""POST /v1/chat/completions: messages through the tokenizer's chat template, then generation."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from folovllm.engine.async_engine import RequestStream
from folovllm.entrypoints.openai.chat_reply import ReplyDeltas, ReplyReader
from folovllm.entrypoints.openai.errors import APIError, bad_request
from folovllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from folovllm.entrypoints.openai.serving import (
    ServingContext,
    TextDeltas,
    event_stream,
    now_s,
    prompt_logprobs_json,
    request_id_of,
    sse,
    with_kv_transfer_params,
)
from folovllm.outputs import CompletionOutput, RequestOutput


@dataclass
class ChatRun:
    """A chat request queued in the engine, and what reading its reply takes."""

    stream: RequestStream
    reader: ReplyReader
    prompt_token_ids: list[int]
    stop: list[str]  # the stop strings: a stream holds back text that could become one
    model: str  # the name a response reports: the adapter that serves it, else the served model


class ChatServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, body: ChatCompletionRequest, raw: Request):
        arrival, request_id = time.perf_counter(), request_id_of(raw, "chatcmpl-")
        run = await self.start(body, request_id, arrival)
        ctx = self.ctx
        if body.stream:
            chunks = self._stream(body, run.stream, request_id, run.stop, run.prompt_token_ids, run.reader,
                                  run.model)
            return StreamingResponse(event_stream(chunks, ctx, [run.stream]), media_type="text/event-stream")
        final = (await ctx.collect([run.stream], raw))[0]
        return JSONResponse(self.response(body, final, request_id, run.reader, run.model))

    async def start(self, body: ChatCompletionRequest, request_id: str, arrival: float,
                    names: dict[str, str] | None = None) -> ChatRun:
        """Checks, renders and queues one chat request: what every API built on chat (Messages,
        Responses) runs. ``names`` maps chat's field names to the calling API's, for its errors."""
        ctx = self.ctx
        names = names or {}
        try:
            lora = ctx.check_model(body.model)
            prompt, params, renames = await ctx.off_loop(ctx.validator.chat, body)
            await ctx.check_structured_outputs(body, params)
            reader = ReplyReader.for_request(body, ctx.validator.chat_settings)
            streams = await ctx.start([prompt], params, request_id, arrival, {**renames, **names},
                                      prompt_param="messages", priority=body.priority, user=body.user,
                                      lora_request=lora)
        except APIError as err:
            raise _renamed(err, names) from err
        return ChatRun(streams[0], reader, prompt["prompt_token_ids"], params.stop, ctx.reported_model(lora))

    async def prompt_ids(self, body: ChatCompletionRequest, names: dict[str, str] | None = None) -> list[int]:
        """The token ids of the prompt ``body`` renders to (what a token count reports), without
        queueing it or checking its sampling and tool_choice."""
        ctx = self.ctx
        try:
            ctx.check_model(body.model)
            body.check_supported()
            return await ctx.off_loop(ctx.validator.chat_prompt_ids, body)
        except ValueError as err:
            raise _renamed(bad_request(err, "messages"), names or {}) from err
        except APIError as err:
            raise _renamed(err, names or {}) from err

    def response(self, body: ChatCompletionRequest, final: RequestOutput, request_id: str,
                 reader: ReplyReader, model: str) -> dict:
        """The non-streaming response body for the request's final output; ``model``: the name it reports
        (``ChatRun.model``)."""
        ctx = self.ctx
        choices = []
        for out in final.outputs:
            message, finish_reason = reader.message(out.text, out.finish_reason)
            choice = {"index": out.index, "message": message,
                      "logprobs": self._logprobs(body, out, 0) if body.logprobs else None,
                      "finish_reason": finish_reason, "stop_reason": out.stop_reason}
            if body.return_token_ids:
                choice["token_ids"] = list(out.token_ids)
            choices.append(choice)
        completion_tokens = sum(len(o.token_ids) for o in final.outputs)
        response = {"id": request_id, "object": "chat.completion", "created": now_s(),
                    "model": model, "choices": choices,
                    "usage": ctx.usage([final], completion_tokens)}
        if body.return_token_ids:
            response["prompt_token_ids"] = final.prompt_token_ids
        if body.prompt_logprobs is not None:
            response["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs, ctx.token_text)
        return with_kv_transfer_params(response, [final])

    def _logprobs(self, body: ChatCompletionRequest, out: CompletionOutput, first_token: int) -> dict:
        """OpenAI chat format: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
        logprob_token, as_ids = self.ctx.logprob_token, body.return_tokens_as_token_ids
        top_n = body.top_logprobs or 0

        def entry(token_id: int, logprob: float) -> dict:
            text = logprob_token(token_id, as_ids)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = []
        for token_id, entries in zip(out.token_ids[first_token:], (out.logprobs or [])[first_token:]):
            item = entry(token_id, entries[token_id].logprob)
            ranked = sorted(entries.items(), key=lambda e: e[1].rank)
            # the dict holds the top-N plus the sampled token (whatever its rank): list the top-N
            item["top_logprobs"] = [entry(t, lp.logprob) for t, lp in ranked if lp.rank <= top_n]
            content.append(item)
        return {"content": content}

    async def _stream(self, body: ChatCompletionRequest, stream: AsyncIterator[RequestOutput], request_id: str,
                      stop: list[str], prompt_token_ids: list[int], reader: ReplyReader,
                      model: str) -> AsyncIterator[str]:
        created = now_s()
        cursors = [TextDeltas(stop) for _ in range(body.n)]
        replies = [ReplyDeltas(reader) for _ in range(body.n)] if reader.reads else None

        def chunk(choices: list[dict], **extra) -> str:
            return sse({"id": request_id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "choices": choices, **extra})

        final = None
        first = {}
        if body.return_token_ids:
            first["prompt_token_ids"] = prompt_token_ids
        if body.continuous_usage:
            first["usage"] = self.ctx.usage_counts(len(prompt_token_ids), 0)
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None} for i in range(body.n)], **first)
        async for output in stream:
            final = output
            choices = []
            for out in output.outputs:
                text, first_token = cursors[out.index].advance(out)
                finish_reason = out.finish_reason
                if replies is None:
                    delta = {"content": text} if text else {}
                else:
                    reply = replies[out.index]
                    delta = reply.advance(text, out.finished())
                    finish_reason = reader.finish_reason(reply.called, finish_reason)
                if not delta and first_token == len(out.token_ids) and not out.finished():
                    continue
                choice = {"index": out.index, "delta": delta,
                          "logprobs": self._logprobs(body, out, first_token) if body.logprobs else None,
                          "finish_reason": finish_reason}
                if body.return_token_ids:
                    choice["token_ids"] = list(out.token_ids[first_token:])
                choices.append(choice)
            if choices:
                extra = with_kv_transfer_params({}, [output])
                if body.continuous_usage:
                    extra["usage"] = self.ctx.usage([output], sum(len(o.token_ids) for o in output.outputs))
                yield chunk(choices, **extra)
        if body.include_usage:
            completion_tokens = sum(len(o.token_ids) for o in final.outputs)
            yield chunk([], usage=self.ctx.usage([final], completion_tokens))


def _renamed(err: APIError, names: dict[str, str]) -> APIError:
    """``err`` speaking the calling API's field names (its param, and a message that starts with one)."""
    if not names or err.param not in names:
        return err
    new = names[err.param]
    message = new + err.message[len(err.param):] if err.message.startswith(err.param) else err.message
    return APIError(err.status_code, message, type=err.type, param=new, code=err.code, headers=err.headers)
