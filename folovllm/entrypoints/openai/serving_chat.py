"""POST /v1/chat/completions: messages through the tokenizer's chat template, then generation."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from folovllm.engine.async_engine import RequestStream
from folovllm.entrypoints.openai.protocol import ChatCompletionRequest
from folovllm.entrypoints.openai.serving import (ServingContext, TextDeltas, event_stream, now_s,
                                                 prompt_logprobs_json, sse, usage)
from folovllm.outputs import CompletionOutput


class ChatServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, body: ChatCompletionRequest, raw: Request):
        arrival = time.perf_counter()
        ctx = self.ctx
        ctx.check_model(body.model)
        prompt, params, renames = await ctx.off_loop(ctx.validator.chat, body)
        await ctx.check_structured_outputs(body, params)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await ctx.start([prompt], params, request_id, arrival, renames, prompt_param="messages",
                                  priority=body.priority, user=body.user)
        if body.stream:
            return StreamingResponse(event_stream(self._stream(body, streams[0], request_id, params.stop),
                                                  ctx, streams), media_type="text/event-stream")
        final = (await ctx.collect(streams, raw))[0]
        choices = [{"index": out.index, "message": {"role": "assistant", "content": out.text},
                    "logprobs": self._logprobs(out, 0, body.top_logprobs or 0) if body.logprobs else None,
                    "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
                   for out in final.outputs]
        completion_tokens = sum(len(o.token_ids) for o in final.outputs)
        response = {"id": request_id, "object": "chat.completion", "created": now_s(),
                    "model": ctx.model_name, "choices": choices, "usage": usage([final], completion_tokens)}
        if body.prompt_logprobs is not None:
            response["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs, ctx.token_text)
        return JSONResponse(response)

    def _logprobs(self, out: CompletionOutput, first_token: int, top_n: int) -> dict:
        """OpenAI chat format: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
        token_text = self.ctx.token_text

        def entry(token_id: int, logprob: float) -> dict:
            text = token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = []
        for token_id, entries in zip(out.token_ids[first_token:], (out.logprobs or [])[first_token:]):
            item = entry(token_id, entries[token_id].logprob)
            ranked = sorted(entries.items(), key=lambda e: e[1].rank)
            # the dict holds the top-N plus the sampled token (whatever its rank): list the top-N
            item["top_logprobs"] = [entry(t, lp.logprob) for t, lp in ranked if lp.rank <= top_n]
            content.append(item)
        return {"content": content}

    async def _stream(self, body: ChatCompletionRequest, stream: RequestStream, request_id: str,
                      stop: list[str]) -> AsyncIterator[str]:
        created, model = now_s(), self.ctx.model_name
        cursors = [TextDeltas(stop) for _ in range(body.n)]

        def chunk(choices: list[dict], **extra) -> str:
            return sse({"id": request_id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "choices": choices, **extra})

        final = None
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None} for i in range(body.n)])
        async for output in stream:
            final = output
            choices = []
            for out in output.outputs:
                delta, first_token = cursors[out.index].advance(out)
                if not delta and first_token == len(out.token_ids) and not out.finished():
                    continue
                choices.append({"index": out.index, "delta": {"content": delta} if delta else {},
                                "logprobs": self._logprobs(out, first_token, body.top_logprobs or 0)
                                if body.logprobs else None,
                                "finish_reason": out.finish_reason})
            if choices:
                yield chunk(choices)
        if body.include_usage:
            completion_tokens = sum(len(o.token_ids) for o in final.outputs)
            yield chunk([], usage=usage([final], completion_tokens))
