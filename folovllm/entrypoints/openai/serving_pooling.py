"""The pooling endpoints: /v1/embeddings, /pooling, /score (and /v1/score), /rerank (and /v1/rerank).

Each input becomes one pooling request; the engine runs them as prefill-only requests and hands back
their pooled vectors. Scores are the cosine similarity of two texts' embeddings; a rerank is a score of
the query against each document, best first. A pooling request on a generative engine is the engine's
ValueError, so a 400 that says why.
"""
from __future__ import annotations

import base64
import struct
import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.params import Depends

from folovllm.entrypoints.openai.errors import APIError, bad_request
from folovllm.entrypoints.openai.protocol_pooling import (
    EmbeddingRequest,
    PoolingInput,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from folovllm.entrypoints.openai.serving import (
    ClientDisconnected,
    ServingContext,
    now_s,
    request_id_of,
)
from folovllm.outputs import RequestOutput
from folovllm.pooling.score import cosine_scores, pair_up
from folovllm.pooling_params import PoolingParams


class PoolingServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def embeddings(self, body: EmbeddingRequest, raw: Request) -> dict:
        return await self._vectors(body, raw, "embed")

    async def pooling(self, body: PoolingRequest, raw: Request) -> dict:
        return await self._vectors(body, raw, "encode")

    async def _vectors(self, body: EmbeddingRequest, raw: Request, task: str) -> dict:
        """OpenAI's embeddings response (vLLM's /pooling shape for ``task="encode"``)."""
        self.ctx.check_model(body.model)
        params = self._params(body, task, dimensions=body.dimensions, normalize=body.normalize)
        request_id, finals = await self._pool(body.input, body.add_special_tokens, params, body, raw, "embd-")
        kind, key = ("embedding", "embedding") if task == "embed" else ("pooling", "data")
        data = [{"index": i, "object": kind, key: _encode(final.pooled, body.encoding_format)}
                for i, final in enumerate(finals)]
        return {"id": request_id, "object": "list", "created": now_s(),
                "model": self.ctx.model_name, "data": data, "usage": _usage(finals)}

    async def score(self, body: ScoreRequest, raw: Request) -> dict:
        self.ctx.check_model(body.model)
        try:
            firsts, seconds = pair_up(body.text_1, body.text_2, str)
        except ValueError as err:
            raise bad_request(err, "text_2") from err
        request_id, scores, finals = await self._scores(firsts, seconds, body, raw, "score-")
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return {"id": request_id, "object": "list", "created": now_s(),
                "model": self.ctx.model_name, "data": data, "usage": _usage(finals)}

    async def rerank(self, body: RerankRequest, raw: Request) -> dict:
        self.ctx.check_model(body.model)
        request_id, scores, finals = await self._scores([body.query] * len(body.documents), body.documents,
                                                        body, raw, "rerank-")
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        if body.top_n:
            order = order[:body.top_n]
        results = []
        for i in order:
            result = {"index": i, "relevance_score": scores[i]}
            if body.return_documents:
                result["document"] = {"text": body.documents[i]}
            results.append(result)
        return {"id": request_id, "model": self.ctx.model_name,
                "usage": {"total_tokens": _usage(finals)["total_tokens"]}, "results": results}

    async def _scores(self, firsts: list[str], seconds: list[str], body: ScoreRequest | RerankRequest,
                      raw: Request, prefix: str) -> tuple[str, list[float], list[RequestOutput]]:
        """The request id, each pair's score and the engine outputs: a cross-encoder's score of the pair,
        else the cosine similarity of the two texts' embeddings (every distinct text embedded once)."""
        ctx, params = self.ctx, self._params(body, "score")
        if ctx.engine.info.cross_encoder:  # each pair as one input, scored by the model's head
            pairs = [await ctx.off_loop(_pair_ids, ctx.tokenizer, a, b) for a, b in zip(firsts, seconds)]
            request_id, finals = await self._pool(pairs, True, params, body, raw, prefix)
            return request_id, [final.pooled[0] for final in finals], finals
        unique = list(dict.fromkeys(firsts + seconds))
        request_id, finals = await self._pool(unique, True, params, body, raw, prefix)
        vectors = {text: final.pooled for text, final in zip(unique, finals)}
        return request_id, cosine_scores([vectors[t] for t in firsts], [vectors[t] for t in seconds]), finals

    def _params(self, body, task: str, **settings) -> PoolingParams:
        try:
            return PoolingParams(task=task, truncate_prompt_tokens=body.truncate_prompt_tokens, **settings)
        except ValueError as err:
            raise bad_request(err) from err

    async def _pool(self, given: PoolingInput, add_special_tokens: bool, params: PoolingParams, body,
                    raw: Request, prefix: str) -> tuple[str, list[RequestOutput]]:
        """Every input as one engine request: the request id and their finished outputs in input order."""
        arrival = time.perf_counter()
        ctx = self.ctx
        inputs = _as_list(given)
        limit = ctx.validator.limits.max_prompts_per_request
        if len(inputs) > limit:
            raise bad_request(f"input holds {len(inputs)} items; at most {limit} are allowed per request", "input")
        prompts = []
        for item in inputs:
            if isinstance(item, str):
                ids = await ctx.off_loop(ctx.validator.encode, item, add_special_tokens, "input")
                prompts.append({"prompt_token_ids": ids, "prompt": item})
            else:
                prompts.append({"prompt_token_ids": item})
        request_id = request_id_of(raw, prefix)
        streams = await ctx.start(prompts, params, request_id, arrival, prompt_param="input",
                                  priority=body.priority, user=body.user)
        try:
            return request_id, await ctx.collect(streams, raw)
        except ClientDisconnected:
            raise APIError(499, "the client closed the connection", type="client_closed") from None


def add_pooling_routes(app: FastAPI, v1: APIRouter, serving: PoolingServing, guarded: list[Depends]) -> None:
    """The routes as vLLM serves them: /v1/embeddings; /pooling; /score and /rerank at the root and under
    /v1; /v2/rerank (Cohere's v2 path, the same body). In /openapi.json on a pooling engine alone (a
    generating one answers each with a 400)."""
    shown = serving.ctx.engine.info.pooling
    v1.add_api_route("/embeddings", serving.embeddings, methods=["POST"], include_in_schema=shown)
    app.add_api_route("/pooling", serving.pooling, methods=["POST"], dependencies=guarded, include_in_schema=shown)
    for path, handler in (("/score", serving.score), ("/rerank", serving.rerank)):
        app.add_api_route(path, handler, methods=["POST"], dependencies=guarded, include_in_schema=shown)
        v1.add_api_route(path, handler, methods=["POST"], name=f"v1_{path[1:]}", include_in_schema=shown)
    app.add_api_route("/v2/rerank", serving.rerank, methods=["POST"], dependencies=guarded, name="v2_rerank",
                      include_in_schema=shown)


def _pair_ids(tokenizer, first: str, second: str) -> list[int]:
    """A text pair as one cross-encoder input: the tokenizer's pair encoding."""
    return tokenizer(first, second)["input_ids"]


def _as_list(given: PoolingInput) -> list[str | list[int]]:
    """OpenAI's ``input`` as a list of items: one string or token-id list, or several."""
    if isinstance(given, str):
        return [given]
    if not given:
        raise bad_request("input is empty; give a string, a list of strings or token ids", "input")
    if all(isinstance(t, int) for t in given):
        return [list(given)]
    return list(given)


def _encode(vector: list, encoding_format: str) -> list | str:
    """A result as a JSON list of floats, or base64 of its little-endian float32 bytes (OpenAI's)."""
    if encoding_format == "float":
        return vector
    flat = [x for row in vector for x in row] if vector and isinstance(vector[0], list) else vector
    return base64.b64encode(struct.pack(f"<{len(flat)}f", *flat)).decode("ascii")


def _usage(finals: list[RequestOutput]) -> dict:
    tokens = sum(len(f.prompt_token_ids) for f in finals)
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
            "prompt_tokens_details": None}
