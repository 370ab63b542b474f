"""A request passed on to a model's child process and its answer streamed back as it comes."""
from __future__ import annotations

import asyncio

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse

from ggserve.server.api.errors import APIError

# hop-by-hop headers and those the client library sets again
_DROP_REQUEST = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade"}
_DROP_RESPONSE = {"content-length", "connection", "transfer-encoding", "keep-alive", "date", "server"}


class Proxy:
    def __init__(self):
        # no idle connection kept to a child: its shutdown would wait for it
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits)

    async def close(self) -> None:
        await self.client.aclose()

    async def forward(self, request: Request, base_url: str, body: bytes, done, path: str | None = None):
        """Send the request to base_url; `done()` runs once when its answer has ended (or failed)."""
        url = base_url + (path or request.url.path)
        if request.url.query:
            url += "?" + request.url.query
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST]
        once = _Once(done)
        try:
            upstream = await self.client.send(
                self.client.build_request(request.method, url, headers=headers, content=body), stream=True)
        except httpx.HTTPError as e:
            once()
            raise APIError(502, f"the model's server did not answer: {type(e).__name__}") from None

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.HTTPError:
                pass                    # the child died mid-answer: the client sees the answer end
            finally:
                await asyncio.shield(upstream.aclose())
                once()

        out = [(k, v) for k, v in upstream.headers.multi_items() if k.lower() not in _DROP_RESPONSE]
        response = StreamingResponse(relay(), status_code=upstream.status_code, background=BackgroundTask(once))
        response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out]
        return response


class _Once:
    """Calls fn the first time it is called (the answer ended, or the client left)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()
