"""What both generation endpoints share: model check, admission, request start, SSE, logprob text."""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from fastapi import Request

from folovllm.engine.async_engine import AsyncLLMEngine, EngineError, RequestStream
from folovllm.entrypoints.openai.errors import APIError, bad_request, server_busy
from folovllm.entrypoints.openai.protocol import SamplingRequest
from folovllm.entrypoints.openai.structured import compile_error, structured_outputs_from_body
from folovllm.entrypoints.openai.validation import ChatSettings, RequestLimits, Validator
from folovllm.lora.request import LoRARequest
from folovllm.outputs import CompletionOutput, RequestOutput
from folovllm.pooling_params import PoolingParams
from folovllm.sampling_params import SamplingParams
from folovllm.structured_output import GrammarCache

_T = TypeVar("_T")
logger = logging.getLogger(__name__)
# ASGI scope key: set once the request reached the engine; an error response after that is no rejection.
REACHED_ENGINE = "folovllm.reached_engine"
# ASGI scope key: the request's id (its X-Request-Id header, else a fresh one), echoed in the response.
REQUEST_ID = "folovllm.request_id"
# Called once per request that reached the engine: (its sampling params, its number of prompts).
AdmittedHook = Callable[[SamplingParams, int, int], None]  # (params, number of prompts, engine replica)


def request_id_of(raw: Request, prefix: str) -> str:
    """``prefix`` + the X-Request-Id the client gave (vLLM's header), else + a fresh id."""
    base = raw.scope.get(REQUEST_ID) or raw.headers.get("x-request-id") or uuid.uuid4().hex
    return prefix + base


class ClientDisconnected(Exception):
    """The client hung up before a non-streaming response was ready."""


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def shutting_down(message: str = "the server is shutting down") -> APIError:
    return APIError(503, message, type="service_unavailable",
                    code="shutting_down", headers={"Retry-After": "5"})


def engine_error(err: EngineError) -> APIError:
    """The HTTP error for a request the engine ended: 500 (failed, engine dead) or 503 (shutdown)."""
    if err.status_code == 503:
        return shutting_down(str(err))
    return APIError(err.status_code, str(err), type=err.error_type, code=err.code)


class ServingContext:
    """State the endpoints share: the engine, the served model name, the API-side tokenizer."""

    def __init__(self, engine: AsyncLLMEngine, model_names: str | list[str], tokenizer,
                 max_waiting_requests: int | None, limits: RequestLimits | None = None,
                 chat_settings: ChatSettings | None = None, on_admitted: AdmittedHook | None = None,
                 prompt_tokens_details: bool = True, log_requests: bool = False,
                 structured_outputs_backend: str = "auto") -> None:
        self.engine = engine
        self.model_names = [model_names] if isinstance(model_names, str) else list(model_names)
        self.model_name = self.model_names[0]  # the name responses report
        self.loras: dict[str, LoRARequest] = {}  # served adapters by name: a request's model may name one
        self.on_admitted = on_admitted
        self.prompt_tokens_details = prompt_tokens_details  # usage.prompt_tokens_details.cached_tokens
        self.log_requests = log_requests
        self.tokenizer = tokenizer  # the server's own: the engine core decodes with its own
        self.max_model_len = engine.info.max_model_len
        self.max_waiting_requests = max_waiting_requests
        self.validator = Validator(tokenizer, self.max_model_len, limits or RequestLimits(),
                                   chat_settings=chat_settings or ChatSettings(),
                                   default_sampling=engine.info.default_sampling,
                                   kv_role=engine.info.kv_role)
        # Tokenizing and chat templates run here, off the event loop; one thread, since a tokenizer
        # object is not safe to call from two threads at once.
        self._tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="folovllm-tokenizer")
        self._token_text: dict[int, str] = {}
        # This process compiles each constraint too (cached, on its own threads), so a bad one is a
        # 400 before the engine sees it. Built now: it reads the vocabulary before any tokenizing.
        self.grammars = GrammarCache(structured_outputs_backend, tokenizer, None, [])
        self.grammars.load()

    async def check_structured_outputs(self, body: SamplingRequest, params: SamplingParams) -> None:
        """Compiles the request's constraint (or finds it cached); a 400 naming its field if it fails."""
        if params.structured_outputs is None:
            return
        try:
            await asyncio.wrap_future(self.grammars.get(params.structured_outputs))
        except ValueError as err:
            found = structured_outputs_from_body(body)  # None: set by other code (e.g. forced tool calls)
            raise compile_error(err, found[1] if found else "structured_outputs") from err

    async def off_loop(self, fn: Callable[..., _T], *args) -> _T:
        """Runs ``fn(*args)`` on the tokenizer thread: the event loop keeps serving meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, fn, *args)

    def close(self) -> None:
        self._tokenizer_thread.shutdown(wait=False, cancel_futures=True)
        self.grammars.close()

    def check_model(self, name: str | None) -> LoRARequest | None:
        """Any served name is accepted; so is none (omitted or ""), meaning the served model; a served
        adapter's name gives that adapter."""
        if name and name in self.loras:
            return self.loras[name]
        if name and name not in self.model_names:
            served = ", ".join(repr(n) for n in [*self.model_names, *self.loras])
            raise APIError(404, f"the model {name!r} does not exist; this server serves {served}",
                           type="not_found_error", param="model", code="model_not_found")
        return None

    def reported_model(self, lora: LoRARequest | None) -> str:
        """The ``model`` a response names: the adapter that served it, else the served model."""
        return lora.lora_name if lora is not None else self.model_name

    async def start(self, prompts: list[dict], params: SamplingParams | PoolingParams, request_id: str,
                    arrival_time: float, param_renames: dict[str, str] | None = None,
                    prompt_param: str = "prompt", priority: int = 0,
                    user: str | None = None, lora_request: LoRARequest | None = None) -> list[RequestStream]:
        """Queues one engine request per prompt in one round trip, all or nothing; engine
        ValueErrors become 400s."""
        limit = self.max_waiting_requests
        if limit is not None and self.engine.num_pending + len(prompts) > limit:
            raise server_busy()
        sub_ids = [request_id] if len(prompts) == 1 else [f"{request_id}-p{i}" for i in range(len(prompts))]
        if self.log_requests:
            for sub_id, prompt in zip(sub_ids, prompts):
                logger.info("request %s: %d prompt tokens, %s", sub_id,
                            len(prompt.get("prompt_token_ids", ())), params)
        try:
            streams = await self.engine.add_requests(sub_ids, prompts, params, arrival_time,
                                                     priority=priority, user=user, lora_request=lora_request)
        except ValueError as err:
            raise bad_request(err, param=prompt_param if "prompt" in str(err) else None,
                              renames=param_renames) from err
        except EngineError as err:
            raise engine_error(err) from err
        if self.on_admitted is not None and isinstance(params, SamplingParams):  # n, max_tokens: generation's
            self.on_admitted(params, len(prompts), streams[0].engine)
        return streams

    def usage(self, finals: list[RequestOutput], completion_tokens: int) -> dict:
        """OpenAI's usage block; ``prompt_tokens_details.cached_tokens`` (prompt tokens served from
        the prefix cache) when --enable-prompt-tokens-details is on, else null."""
        return self._gated(usage(finals, completion_tokens))

    def usage_counts(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
        """The usage block from its counts (a stream's usage so far), gated as ``usage``."""
        return self._gated(usage_counts(prompt_tokens, completion_tokens, cached_tokens))

    def _gated(self, block: dict) -> dict:
        if not self.prompt_tokens_details:
            block["prompt_tokens_details"] = None
        return block

    def abort_unfinished(self, streams: list[RequestStream]) -> None:
        """Aborts the streams still running (their client left, or a sibling failed): one INFO line."""
        unfinished = [stream for stream in streams if not stream.finished]
        for stream in unfinished:
            self.engine.abort(stream.request_id)
        if unfinished:
            logger.info("request %s abandoned after %d output token(s): aborted %d unfinished",
                        streams[0].request_id, sum(s.num_output_tokens for s in streams), len(unfinished))

    async def collect(self, streams: list[RequestStream], raw: Request) -> list[RequestOutput]:
        """The final output of every stream; aborts them all if the client disconnects first."""
        raw.scope[REACHED_ENGINE] = True
        async def last(stream: RequestStream) -> RequestOutput:
            final = None
            async for output in stream:
                final = output
            return final

        work = asyncio.ensure_future(asyncio.gather(*(last(s) for s in streams)))
        watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not work.done():
            work.cancel()  # each stream's iterator aborts its request on the way out
            work.add_done_callback(_consume_cancellation)
            self.abort_unfinished(streams)
            raise ClientDisconnected()
        try:
            return work.result()
        except EngineError as err:
            raise engine_error(err) from err

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def logprob_token(self, token_id: int, as_token_id: bool) -> str:
        """How logprobs name a token: its text, or ``"token_id:123"`` (vLLM's
        ``return_tokens_as_token_ids``, for tokens whose text is not valid UTF-8 on its own)."""
        return f"token_id:{token_id}" if as_token_id else self.token_text(token_id)


def _consume_cancellation(work: asyncio.Future) -> None:
    """Retrieves a cancelled gather's outcome: its CancelledError is expected, not an unseen error."""
    if not work.cancelled():
        work.exception()


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several streams as they come; one stream is iterated directly."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as err:
            queue.put_nowait((index, err))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            remaining -= item.finished
            yield index, item
    finally:
        for task in tasks:
            task.cancel()


class TextDeltas:
    """Per-choice streaming cursor: new text and new tokens.

    With stop strings, the last ``longest stop - 1`` chars are held back until the request ends:
    they could still turn into a stop string, which the client must never see. Holding back a fixed
    number of chars costs nothing per step, whatever the stop strings are.
    """

    def __init__(self, stop: list[str]) -> None:
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.num_chars = 0
        self.num_tokens = 0

    def advance(self, output: CompletionOutput) -> tuple[str, int]:
        """The text not yet sent and the index of the first token not yet sent."""
        text = output.text
        end = len(text) if output.finished() else max(len(text) - self.holdback, 0)
        delta = text[self.num_chars:end] if end > self.num_chars else ""
        self.num_chars = max(self.num_chars, end)
        first_token = self.num_tokens
        self.num_tokens = len(output.token_ids)
        return delta, first_token


async def event_stream(chunks: AsyncIterator[str], ctx: ServingContext,
                       streams: list[RequestStream]) -> AsyncIterator[str]:
    """A streamed response's body: the chunks, an error event if the engine ended the request, then
    ``[DONE]``; the requests are aborted if the client leaves first."""
    try:
        async for chunk in chunks:
            yield chunk
    except EngineError as err:
        yield sse(engine_error(err).body())
    finally:
        ctx.abort_unfinished(streams)
    yield sse("[DONE]")


def usage(finals: list[RequestOutput], completion_tokens: int) -> dict:
    """OpenAI's usage block; cached_tokens counts prompt tokens served from the prefix cache."""
    return usage_counts(sum(len(f.prompt_token_ids) for f in finals), completion_tokens,
                        sum(f.num_cached_tokens for f in finals))


def usage_counts(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """The usage block from its counts (a stream's first chunk: nothing is known yet but the prompt)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def prompt_logprobs_json(entries: list | None, token_text: Callable[[int], str]) -> list | None:
    """vLLM's ``prompt_logprobs``: per prompt token, null (the first) or
    {token id: {logprob, rank, decoded_token}}."""
    if entries is None:
        return None
    return [None if entry is None else
            {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": token_text(t)}
             for t, lp in entry.items()} for entry in entries]


def with_kv_transfer_params(payload: dict, outputs: list[RequestOutput | None]) -> dict:
    """PD disaggregation: a producer's params for the consumer, top-level in the response (or the
    streamed chunk that ends the request), when the engine handed some out."""
    found = next((o.kv_transfer_params for o in outputs if o is not None and o.kv_transfer_params), None)
    if found is not None:
        payload["kv_transfer_params"] = found
    return payload


def now_s() -> int:
    return int(time.time())
