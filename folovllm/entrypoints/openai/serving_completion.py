"""POST /v1/completions: prompts (text or token ids) in, text completions out, streamed or not."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from folovllm.engine.async_engine import RequestStream
from folovllm.entrypoints.openai.protocol import CompletionRequest
from folovllm.entrypoints.openai.serving import (
    ServingContext,
    TextDeltas,
    event_stream,
    merge_streams,
    now_s,
    prompt_logprobs_json,
    request_id_of,
    sse,
    with_kv_transfer_params,
)
from folovllm.outputs import CompletionOutput, RequestOutput


class CompletionServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, body: CompletionRequest, raw: Request):
        arrival = time.perf_counter()
        ctx = self.ctx
        lora = ctx.check_model(body.model)
        prompts, params = await ctx.off_loop(ctx.validator.completion, body)
        await ctx.check_structured_outputs(body, params)
        request_id = request_id_of(raw, "cmpl-")
        streams = await ctx.start(prompts, params, request_id, arrival, priority=body.priority,
                                  user=body.user, lora_request=lora)
        if body.stream:
            chunks = self._stream(body, prompts, streams, request_id, params.stop, ctx.reported_model(lora))
            return StreamingResponse(event_stream(chunks, ctx, streams), media_type="text/event-stream")
        finals = await ctx.collect(streams, raw)
        choices, completion_tokens = [], 0
        for i, final in enumerate(finals):
            echo = self._prompt_text(prompts[i]) if body.echo else ""
            for out in final.outputs:
                out = _without_generation(out) if _scores_only(body) else out
                completion_tokens += len(out.token_ids)
                logprobs = None
                if body.logprobs is not None:
                    logprobs = self._logprobs(body, out, 0, len(echo))
                    if body.echo:
                        logprobs = _concat(self._prompt_logprobs(body, final), logprobs)
                choice = {"index": i * params.n + out.index, "text": echo + out.text,
                          "logprobs": logprobs, "finish_reason": out.finish_reason,
                          "stop_reason": out.stop_reason}
                if body.return_token_ids:
                    choice["prompt_token_ids"] = final.prompt_token_ids
                    choice["token_ids"] = list(out.token_ids)
                if body.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs, ctx.token_text)
                choices.append(choice)
        return JSONResponse(with_kv_transfer_params(
            {"id": request_id, "object": "text_completion", "created": now_s(), "model": ctx.reported_model(lora),
             "choices": choices, "usage": ctx.usage(finals, completion_tokens)}, finals))

    def _prompt_text(self, prompt: dict) -> str:
        text = prompt.get("prompt")
        return text if text is not None else self.ctx.tokenizer.decode(prompt["prompt_token_ids"])

    def _prompt_logprobs(self, body: CompletionRequest, final: RequestOutput) -> dict:
        """The echoed prompt's tokens in the completions logprobs format; the first has no logprob."""
        token_text, as_ids = self.ctx.token_text, body.return_tokens_as_token_ids
        name = self.ctx.logprob_token
        result = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = 0
        entries = final.prompt_logprobs or [None] * len(final.prompt_token_ids)
        for token_id, entry in zip(final.prompt_token_ids, entries):
            result["tokens"].append(name(token_id, as_ids))
            result["token_logprobs"].append(None if entry is None else entry[token_id].logprob)
            result["top_logprobs"].append(None if entry is None else {
                name(t, as_ids): lp.logprob for t, lp in sorted(entry.items(), key=lambda e: e[1].rank)})
            result["text_offset"].append(offset)
            offset += len(token_text(token_id))  # offsets point into the text, however tokens are named
        return result

    def _logprobs(self, body: CompletionRequest, out: CompletionOutput, first_token: int,
                  text_offset: int) -> dict:
        """OpenAI completions format for tokens [first_token:]: tokens, token_logprobs, top_logprobs,
        text_offset."""
        token_text, as_ids = self.ctx.token_text, body.return_tokens_as_token_ids
        name = self.ctx.logprob_token
        result = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = text_offset
        for token_id, entries in zip(out.token_ids[first_token:], (out.logprobs or [])[first_token:]):
            result["tokens"].append(name(token_id, as_ids))
            result["token_logprobs"].append(entries[token_id].logprob)
            result["top_logprobs"].append({name(t, as_ids): lp.logprob for t, lp in
                                           sorted(entries.items(), key=lambda e: e[1].rank)})
            result["text_offset"].append(offset)
            offset += len(token_text(token_id))
        return result

    async def _stream(self, body: CompletionRequest, prompts: list[dict], streams: list[RequestStream],
                      request_id: str, stop: list[str], model: str) -> AsyncIterator[str]:
        n = body.n
        created = now_s()
        cursors = [[TextDeltas(stop) for _ in range(n)] for _ in streams]
        offsets = [[0] * n for _ in streams]
        finals: list[RequestOutput | None] = [None] * len(streams)

        def chunk(choices: list[dict], output: RequestOutput | None = None) -> str:
            payload = {"id": request_id, "object": "text_completion", "created": created,
                       "model": model, "choices": choices}
            if body.continuous_usage:
                payload["usage"] = usage_so_far()
            return sse(with_kv_transfer_params(payload, [output]))

        def usage_so_far() -> dict:
            done = [f for f in finals if f is not None]
            generated = 0 if _scores_only(body) else sum(len(o.token_ids) for f in done for o in f.outputs)
            return self.ctx.usage_counts(sum(len(p["prompt_token_ids"]) for p in prompts), generated,
                                         sum(f.num_cached_tokens for f in done))

        ids_sent: set[int] = set()  # choices whose prompt_token_ids went out (return_token_ids)

        def with_ids(choice: dict, i: int, token_ids: list[int]) -> dict:
            if body.return_token_ids:
                if choice["index"] not in ids_sent:
                    ids_sent.add(choice["index"])
                    choice["prompt_token_ids"] = prompts[i]["prompt_token_ids"]
                choice["token_ids"] = token_ids
            return choice

        echo_waits: set[int] = set()  # echoes that carry prompt logprobs: sent with the first output
        if body.echo:
            for i, prompt in enumerate(prompts):
                text = self._prompt_text(prompt)
                for j in range(n):
                    offsets[i][j] = len(text)
                if body.logprobs is not None:
                    echo_waits.add(i)
                    continue
                yield chunk([with_ids({"index": i * n + j, "text": text, "logprobs": None,
                                       "finish_reason": None}, i, []) for j in range(n)])
        async for i, output in merge_streams(streams):
            finals[i] = output
            if i in echo_waits:
                echo_waits.discard(i)
                text, logprobs = self._prompt_text(prompts[i]), self._prompt_logprobs(body, output)
                yield chunk([with_ids({"index": i * n + j, "text": text, "logprobs": logprobs,
                                       "finish_reason": None}, i, []) for j in range(n)])
            choices = []
            for out in output.outputs:
                out = _without_generation(out) if _scores_only(body) else out
                delta, first_token = cursors[i][out.index].advance(out)
                if not delta and first_token == len(out.token_ids) and not out.finished():
                    continue
                logprobs = None
                if body.logprobs is not None:
                    logprobs = self._logprobs(body, out, first_token, offsets[i][out.index])
                offsets[i][out.index] += len(delta)
                choices.append(with_ids({"index": i * n + out.index, "text": delta, "logprobs": logprobs,
                                         "finish_reason": out.finish_reason,
                                         "stop_reason": out.stop_reason}, i, list(out.token_ids[first_token:])))
            if choices:
                yield chunk(choices, output)
        if body.include_usage:
            completion_tokens = 0 if _scores_only(body) else sum(
                len(o.token_ids) for f in finals for o in f.outputs)
            yield sse({"id": request_id, "object": "text_completion", "created": created,
                       "model": model, "choices": [],
                       "usage": self.ctx.usage(finals, completion_tokens)})


def _scores_only(body: CompletionRequest) -> bool:
    """echo with max_tokens=0: the prompt (and its logprobs) only; the one token the engine ran for
    is not shown."""
    return body.echo and body.max_tokens == 0


def _without_generation(out: CompletionOutput) -> CompletionOutput:
    return CompletionOutput(out.index, "", [], None, [] if out.logprobs is not None else None,
                            finish_reason="length" if out.finished() else None)


def _concat(first: dict, second: dict) -> dict:
    return {key: first[key] + second[key] for key in first}
