"""ASGI middleware that reads at most ``max_bytes`` of a request body: a 413 past that.

It buffers the body before the app sees it (one pass, counted as it arrives, chunked or not), so no
handler ever parses more than the limit; JSON parsing runs on the event loop, and this keeps it short.
"""
from __future__ import annotations

from folovllm.entrypoints.openai.errors import APIError, request_too_large


class BodySizeLimit:
    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                error = APIError(400, "the Content-Length header is not a number")
                await error.response()(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await request_too_large(self.max_bytes).response()(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await request_too_large(self.max_bytes).response()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the real channel: disconnects still reach the app

        await self.app(scope, replay, send)
