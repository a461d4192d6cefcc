"""The client side of ``bench serve``: one streamed request to an OpenAI-compatible server, timed.

A streamed chunk "carries tokens" when its text is non-empty (completions ``text``, chat
``delta.content``), as vLLM's benchmark counts them: the role-only first chunk of chat and a final
chunk with only a finish reason are not tokens. A chunk whose tokens decode to no text yet (e.g. half
a UTF-8 character) merges into the next chunk's gap. Output tokens come from the usage the server
sends at the end (``stream_options.include_usage``), else from the chunks carrying tokens.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from folovllm.bench.datasets import ServeRequest
from folovllm.bench.results import RequestTiming

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "embeddings": "/v1/embeddings"}


@dataclass
class RequestOutcome:
    """What the client saw of one request (``time.perf_counter`` seconds)."""

    request: ServeRequest
    send_time: float
    end_time: float  # last token received on success; when the failure was seen otherwise
    chunk_times: list[float] = field(default_factory=list)  # receive time of each chunk carrying tokens
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None  # None: success

    @property
    def success(self) -> bool:
        return self.error is None

    def timing(self) -> RequestTiming:
        return RequestTiming(
            num_prompt_tokens=self.prompt_tokens, num_output_tokens=self.output_tokens,
            arrival_time=self.send_time, finished_time=self.end_time,
            first_token_time=self.chunk_times[0] if self.chunk_times else None,
            token_times=list(self.chunk_times))


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def request_body(endpoint: str, model: str, req: ServeRequest,
                 extra_body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Streamed, greedy (as vLLM's benchmark), with usage at the end; ignore_eos fixes the length.
    ``extra_body``: more fields for every request (e.g. a structured-outputs constraint). Embeddings:
    the prompt as ``input``, nothing generated."""
    if endpoint == "embeddings":
        return {"model": model, "input": req.prompt, **(extra_body or {})}
    body: dict[str, Any] = {"model": model, "max_tokens": req.max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if req.ignore_eos:
        body["ignore_eos"] = True
    if endpoint == "chat":
        body["messages"] = req.messages
    elif endpoint == "completions":
        body["prompt"] = req.prompt
    else:
        raise ValueError(f"endpoint must be one of {sorted(ENDPOINT_PATHS)}, got {endpoint!r}.")
    return {**body, **(extra_body or {})}


def error_message(status: int, text: str) -> str:
    """``HTTP 400: <message>`` from an OpenAI error body ({"error": {"message"}}), FastAPI's
    {"detail"}, or the raw text."""
    try:
        payload = json.loads(text)
        detail = payload.get("error", payload.get("detail", text)) if isinstance(payload, dict) else text
        message = detail.get("message", detail) if isinstance(detail, dict) else detail
    except json.JSONDecodeError:
        message = text
    return f"HTTP {status}: {str(message).strip()[:300]}"


def chunk_text(payload: dict[str, Any]) -> str:
    """Text of the first choice of a completions or chat chunk ("" when there is none)."""
    choices = payload.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return (choice["delta"] or {}).get("content") or ""
    return choice.get("text") or ""


async def send_request(http: httpx.AsyncClient, endpoint: str, model: str, req: ServeRequest,
                       extra_body: dict[str, Any] | None = None) -> RequestOutcome:
    """POSTs ``req`` streamed and records when each chunk carrying tokens arrives; never raises for
    a failed request: the outcome's ``error`` says why (HTTP status, server error, connection)."""
    body = request_body(endpoint, model, req, extra_body)
    if endpoint == "embeddings":
        return await _send_unstreamed(http, ENDPOINT_PATHS[endpoint], body, req)
    outcome = RequestOutcome(req, send_time=time.perf_counter(), end_time=0.0, prompt_tokens=req.prompt_len)
    usage: dict[str, Any] | None = None
    done = False
    try:
        async with http.stream("POST", ENDPOINT_PATHS[endpoint], json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", errors="replace")
                outcome.error = error_message(resp.status_code, text)
            else:
                async for line in resp.aiter_lines():
                    now = time.perf_counter()
                    if not line.startswith("data:"):
                        continue  # blank separators, comments, event: lines
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    payload = json.loads(data)
                    if "error" in payload:
                        err = payload["error"]
                        outcome.error = f"stream error: {err.get('message', err) if isinstance(err, dict) else err}"
                        break
                    usage = payload.get("usage") or usage
                    if chunk_text(payload):
                        outcome.chunk_times.append(now)
                if outcome.error is None and not done:
                    outcome.error = "stream ended without [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        outcome.error = f"{type(err).__name__}: {err}"
    if outcome.success:
        if usage:
            outcome.prompt_tokens = int(usage.get("prompt_tokens", outcome.prompt_tokens))
            outcome.output_tokens = int(usage.get("completion_tokens", len(outcome.chunk_times)))
        else:
            outcome.output_tokens = len(outcome.chunk_times)
    outcome.end_time = outcome.chunk_times[-1] if outcome.success and outcome.chunk_times else time.perf_counter()
    return outcome


async def _send_unstreamed(http: httpx.AsyncClient, path: str, body: dict[str, Any],
                           req: ServeRequest) -> RequestOutcome:
    """An unstreamed request (embeddings): done when its response arrives; prompt tokens from its usage."""
    outcome = RequestOutcome(req, send_time=time.perf_counter(), end_time=0.0, prompt_tokens=req.prompt_len)
    try:
        resp = await http.post(path, json=body)
        if resp.status_code != 200:
            outcome.error = error_message(resp.status_code, resp.text)
        else:
            usage = resp.json().get("usage") or {}
            outcome.prompt_tokens = int(usage.get("prompt_tokens", outcome.prompt_tokens))
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        outcome.error = f"{type(err).__name__}: {err}"
    outcome.end_time = time.perf_counter()
    return outcome


@dataclass
class ServedModel:
    id: str
    owned_by: str | None = None
    max_model_len: int | None = None


def fetch_models(base_url: str, api_key: str | None, timeout_s: float = 30.0) -> list[ServedModel]:
    """GET /v1/models; ValueError with the reason when the server cannot be asked."""
    try:
        resp = httpx.get(f"{base_url.rstrip('/')}/v1/models", headers=auth_headers(api_key), timeout=timeout_s)
    except httpx.HTTPError as err:
        raise ValueError(f"could not reach {base_url}/v1/models ({err}); is the server up at --base-url?") from None
    if resp.status_code != 200:
        raise ValueError(f"GET {base_url}/v1/models: {error_message(resp.status_code, resp.text)}")
    return [ServedModel(m["id"], m.get("owned_by"), m.get("max_model_len")) for m in resp.json().get("data", [])]


def wait_for_health(base_url: str, timeout_s: float, check: Callable[[], None] | None = None, poll_s: float = 0.2,
                    request_timeout_s: float = 2.0, verify: bool = True) -> bool:
    """Polls ``GET {base_url}/health`` until it answers 200 (True) or ``timeout_s`` passes (False).

    ``check`` runs before each poll and raises to give up early (the server's process exited, say);
    ``verify=False`` accepts a self-signed certificate.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check is not None:
            check()
        try:
            if httpx.get(f"{base_url}/health", timeout=request_timeout_s, verify=verify).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(poll_s)
    return False
