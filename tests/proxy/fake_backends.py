"""Fake prefill and decode servers that keep the proxy's contract and record what they receive,
each served by uvicorn on a free port in a thread of the test process."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Behaviour:
    """What a fake answers; tests change it and ``reset()`` restores it."""

    error_status: int | None = None  # answer every generation request with this error
    kv_params: bool = True  # a prefill answer carries kv_transfer_params
    num_chunks: int = 3  # tokens in a streamed decode answer
    chunk_delay_s: float = 0.0  # between streamed tokens
    received: list[Received] = field(default_factory=list)
    stream_closed_early: threading.Event = field(default_factory=threading.Event)

    def reset(self) -> None:
        self.__init__()


def fake_server(name: str, behaviour: Behaviour) -> FastAPI:
    """A server named ``name``: a prefill answer's kv_transfer_params name it and the request id; a
    decode answer echoes the kv_transfer_params it got, streamed (one chunk per token) or not."""
    app = FastAPI()

    async def generate(raw: Request, chat: bool):
        body = await raw.json()
        behaviour.received.append(Received(raw.url.path, body, dict(raw.headers)))
        if behaviour.error_status is not None:
            return JSONResponse({"error": {"message": f"{name} refuses", "type": "invalid_request_error",
                                           "param": "prompt", "code": None}},
                                status_code=behaviour.error_status, headers={"Retry-After": "7"})
        params = body.get("kv_transfer_params")
        if params == {"do_remote_decode": True}:  # a prefill
            answer: dict[str, Any] = {"id": "p", "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
            if behaviour.kv_params:
                answer["kv_transfer_params"] = {"remote_engine_id": name, "remote_block_ids": [3, 1, 4],
                                                "request_id": raw.headers.get("x-request-id")}
            return answer
        if not body.get("stream"):
            return {"id": "d", "served_by": name, "kv_transfer_params_seen": params,
                    "choices": [{"index": 0, "text": " tok" * behaviour.num_chunks, "finish_reason": "length"}]}

        async def events():
            sent = 0
            try:
                for i in range(behaviour.num_chunks):
                    key = "delta" if chat else "text"
                    choice = {"index": 0, key: {"content": f" tok{i}"} if chat else f" tok{i}"}
                    yield f"data: {json.dumps({'served_by': name, 'choices': [choice]})}\n\n"
                    sent += 1
                    await asyncio.sleep(behaviour.chunk_delay_s)
                yield "data: [DONE]\n\n"
            finally:
                if sent < behaviour.num_chunks:
                    behaviour.stream_closed_early.set()

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(raw: Request):
        return await generate(raw, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(raw: Request):
        return await generate(raw, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": f"model-of-{name}", "object": "model"}]}

    @app.get("/health")
    async def health():
        return JSONResponse({}, status_code=503 if behaviour.error_status == 503 else 200)

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadedServer:
    """An ASGI app served by uvicorn on 127.0.0.1 in a daemon thread."""

    def __init__(self, app, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout_s: float = 30.0) -> "ThreadedServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
