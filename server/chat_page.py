"""The chat page at `/` (static files in server/webui/) and `GET /props`.

The page is three files written by hand, read once and served from memory: no
build step, nothing from a CDN. It is public, as llama-server's is; everything
it fetches (`/props`, `/v1/chat/completions`) goes through the API key check.
`/props` follows llama-server's shape so pages written for one work on the other.
"""
from __future__ import annotations

import os
from typing import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

STATIC = os.path.join(os.path.dirname(__file__), "webui")  # shipped as package data
_FILES = {  # URL path -> (file, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/webui/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/webui/chat.css": ("chat.css", "text/css; charset=utf-8"),
}
# The page runs no inline script and loads nothing from elsewhere; Markdown from
# the model is escaped before it becomes HTML, and this is the second fence.
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
}


def _static_route(path: str, name: str, media_type: str) -> Route:
    with open(os.path.join(STATIC, name), "rb") as f:
        body = f.read()

    async def endpoint(request: Request) -> Response:
        return Response(body, media_type=media_type, headers=_HEADERS)

    return Route(path, endpoint, methods=["GET"], name=f"webui:{path}")


def props(api) -> dict:
    """llama-server's /props: what a chat page needs to know about the server."""
    from .sampling import SamplingParams

    engine = api.engine  # 503 while loading, 500 if loading failed
    d = SamplingParams()
    tok = engine.tokenizer
    return {
        "default_generation_settings": {
            "n_ctx": engine.n_ctx,
            "params": {"temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p,
                       "min_p": d.min_p, "n_predict": -1},
        },
        "total_slots": api.cfg.n_parallel,
        "model_alias": api.model_id(),
        "model_path": os.fspath(api.cfg.model),
        "modalities": {"vision": engine.vision is not None, "audio": False},
        "chat_template": engine.chat_template.source,
        "bos_token": tok.id_to_token(tok.bos_id) if tok.bos_id is not None and tok.bos_id >= 0 else "",
        "eos_token": tok.id_to_token(tok.eos_id) if tok.eos_id is not None and tok.eos_id >= 0 else "",
        "webui": api.cfg.webui,
        "build_info": "ggserve",
    }


def routes(api, route: Callable, *, page: bool) -> list[Route]:
    """`route(path, fn, methods, name)` is create_app's wrapper (API key, metrics);
    the page itself is served without it."""

    async def props_endpoint(request: Request) -> Response:
        return JSONResponse(props(api))

    out = [route("/props", props_endpoint, ["GET"], "props")]
    if page:
        out += [_static_route(p, name, mt) for p, (name, mt) in _FILES.items()]
    return out
