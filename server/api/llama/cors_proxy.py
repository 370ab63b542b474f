"""`/cors-proxy?url=...` (`--ui-mcp-proxy`): the chat page reaches remote MCP servers through the
server, which browsers' CORS rules would otherwise stop; as llama-server 11434 serves it.

Only http(s) URLs with a host and no credentials in them; the request's
`x-llama-server-proxy-header-NAME` headers go as NAME, its body as is; the answer comes back
streamed, status and content type kept. Off by default (403): it lets a client make this server
fetch any URL it can reach, so it is behind the API key and meant for trusted networks only.
"""
from __future__ import annotations

from typing import Callable
from urllib.parse import urlsplit

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ggserve.server.api.errors import APIError
from ggserve.server.api.llama.tools import disabled

HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_SECONDS = 600
# hop-by-hop and length headers: the server sets its own
_DROPPED = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


def target_url(url: str) -> str:
    """url when it may be proxied; APIError 500 (llama-server's status for it) when not."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host, parts = None, None
    if not host:
        raise APIError(500, "invalid target URL: missing host")
    if parts.password:
        raise APIError(500, "authentication in target URL is not supported")
    if parts.scheme not in ("http", "https"):
        raise APIError(500, f"unsupported URL scheme in target URL: {parts.scheme}")
    return url


def routes(route: Callable, enabled: bool) -> list[Route]:
    async def proxy(request: Request) -> Response:
        if not enabled:
            raise disabled()
        url = target_url(request.query_params.get("url", ""))
        headers = {k[len(HEADER_PREFIX):]: v for k, v in request.headers.items()
                   if k.lower().startswith(HEADER_PREFIX) and len(k) > len(HEADER_PREFIX)}
        body = await request.body() if request.method == "POST" else None
        client = httpx.AsyncClient(timeout=TIMEOUT_SECONDS, follow_redirects=False)
        try:
            upstream = await client.send(client.build_request(request.method, url, headers=headers, content=body),
                                         stream=True)
        except httpx.HTTPError as e:
            await client.aclose()
            raise APIError(500, f"proxy request failed: {type(e).__name__}: {e}") from None
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED}

        async def close() -> None:
            await upstream.aclose()
            await client.aclose()

        if upstream.status_code in (204, 304) or request.method == "HEAD":
            await close()
            return Response(status_code=upstream.status_code, headers=kept)
        return StreamingResponse(upstream.aiter_bytes(), status_code=upstream.status_code, headers=kept,
                                 background=BackgroundTask(close))

    return [route("/cors-proxy", proxy, ["GET", "POST"], "cors_proxy")]
