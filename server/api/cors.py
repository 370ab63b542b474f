"""CORS as llama-server 11434 answers it (tools/server/server-http.cpp), as ASGI middleware.

--cors-origins '*' (the default): every request's Origin is echoed with credentials allowed;
'localhost': an Origin whose host is localhost, 127.0.0.1 or ::1 (any scheme and port) is echoed,
any other gets no Access-Control-Allow-Origin; a list: an Origin in it is echoed (llama-server sends
the list itself, which browsers reject for more than one). Every OPTIONS request is a preflight,
answered 200 before authentication: browsers send no credentials with it. Header names keep
llama-server's capitals (HTTP does not care; clients that read headers into a plain dict do).
"""
from __future__ import annotations

from urllib.parse import urlsplit

METHODS = b"GET, POST, DELETE, OPTIONS"


def origin_is_localhost(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")


class CORS:
    def __init__(self, app, origins: list[str]):
        self.app, self.origins = app, origins

    def allowed(self, origin: str) -> str | None:
        if "*" in self.origins:
            return origin
        if "localhost" in self.origins and origin_is_localhost(origin):
            return origin
        return origin if origin in self.origins else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        origin = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"origin"), "")
        allow = self.allowed(origin) if origin else None
        extra = [(b"Access-Control-Allow-Origin", allow.encode("latin-1"))] if allow else []
        if scope["method"] == "OPTIONS":
            headers = extra + [(b"Access-Control-Allow-Credentials", b"true"),
                               (b"Access-Control-Allow-Methods", METHODS),
                               (b"Access-Control-Allow-Headers", b"*"),
                               (b"content-type", b"text/html"), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message):
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra,
                                                  (b"Access-Control-Allow-Credentials", b"true"),
                                                  (b"vary", b"Origin")]}
            await send(message)

        await self.app(scope, receive, send_with_cors)
