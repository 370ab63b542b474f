"""llama-server's --api-prefix: the whole API (and the chat page) answers under a path prefix,
for a reverse proxy that forwards /PREFIX/... unchanged; other paths are a 404."""
from __future__ import annotations

from starlette.responses import RedirectResponse

from ggserve.server.api.errors import APIError


class ApiPrefix:
    """ASGI middleware: /PREFIX/x reaches the app as /x; anything else is a 404 in the API's error shape."""

    def __init__(self, app, prefix: str):
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path == self.prefix and scope["type"] == "http":     # the page's relative links need the slash
            return await RedirectResponse(self.prefix + "/", status_code=308)(scope, receive, send)
        if path.startswith(self.prefix + "/"):
            rest = path[len(self.prefix):]
            scope = dict(scope, path=rest, raw_path=rest.encode())
            return await self.app(scope, receive, send)
        await APIError(404, f"Not found: this server answers under {self.prefix}/").response()(scope, receive, send)


def normalized(prefix: str | None) -> str:
    """--api-prefix as given ("/llama", "llama/", ""): "" or "/llama"."""
    prefix = (prefix or "").strip().strip("/")
    return "/" + prefix if prefix else ""
