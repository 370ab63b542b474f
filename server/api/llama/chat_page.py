"""The chat page at `/` (static files in server/api/llama/webui/), with /props (server/api/llama/props.py).

The page is four files written by hand, read once and served from memory: no
build step, nothing from a CDN. It is public, as llama-server's is; everything
it fetches (`/props`, `/v1/chat/completions`, `/tools`) goes through the API key check.
`/props` follows llama-server's shape so pages written for one work on the other.
"""
from __future__ import annotations

import os
from typing import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

STATIC = os.path.join(os.path.dirname(__file__), "webui")  # shipped as package data
_FILES = {  # URL path -> (file, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/webui/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/webui/tools.js": ("tools.js", "text/javascript; charset=utf-8"),
    "/webui/chat.css": ("chat.css", "text/css; charset=utf-8"),
}
# The page runs no inline script and loads nothing from elsewhere; Markdown from
# the model is escaped before it becomes HTML, and this is the second fence.
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; media-src 'self' data: blob:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
}


def _static_route(path: str, name: str, media_type: str, tools: bool = False) -> Route:
    with open(os.path.join(STATIC, name), "rb") as f:
        body = f.read()
    if tools and name == "index.html":      # the page asks GET /tools only when there are tools
        body = body.replace(b"<head>", b'<head>\n<meta name="ggserve-tools" content="on">', 1)

    async def endpoint(request: Request) -> Response:
        return Response(body, media_type=media_type, headers=_HEADERS)

    return Route(path, endpoint, methods=["GET"], name=f"webui:{path}")


def routes(api, route: Callable, *, page: bool) -> list[Route]:
    """`route(path, fn, methods, name)` is create_app's wrapper (API key, metrics);
    the page itself is served without it."""

    from ggserve.server.api.llama import props as props_api

    out = props_api.routes(api, route)      # /props: GET, and POST with --props
    if page:
        agent = getattr(api.cfg, "agent", None)
        tools = bool(agent and agent.serves_tools)
        out += [_static_route(p, name, mt, tools) for p, (name, mt) in _FILES.items()]
    return out
