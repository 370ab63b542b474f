"""Resumable streams, as llama-server 11434 serves them (tools/server/server-stream.cpp).

A streamed answer whose request carries `X-Conversation-Id: ID` is also kept in a session
under ID (its SSE bytes, the last 4 MiB), and it survives its client: when the client goes,
generation goes on into the session until it ends. A chat page that reloads, or a phone that
loses its connection, picks the answer up again:

- `GET /v1/stream?conv_id=ID&from=N`: the session's bytes from byte N, then the rest as it
  is generated (404 for an unknown or expired ID; 400 when byte N was dropped by the cap);
- `POST /v1/streams/lookup` `{"conversation_ids": [...]}`: those sessions (ID itself, or
  `ID::model`) as `{conversation_id, is_done, total_bytes, started_at, completed_at}`,
  only for IDs asked about, so no client can list the others;
- `DELETE /v1/stream?conv_id=ID`: stop: the generation is cancelled and the session
  dropped (204, also when there was none).

A new stream under the same ID replaces (and stops) the old one. Sessions are kept 300 s
after they end. The id travels in the query string, not the path: it may hold a model name
with slashes. With API keys, a session belongs to the key that started it
(server/api/owners.py): each key has its own ids, and another key's session is not found
(404), not listed, and neither stopped nor replaced.
"""
from __future__ import annotations

import asyncio
import time

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ggserve.server.api.errors import APIError, invalid

MAX_BYTES = 4 * 2**20            # a session keeps the last 4 MiB of its stream
TTL_SECONDS = 300                # an ended session is kept this long
MAX_SESSIONS = 256               # and at most this many sessions, the oldest ended ones go first


class Session:
    def __init__(self, conv_id: str, cancelled: asyncio.Event, owner: str = ""):
        self.conv_id = conv_id
        self.owner = owner               # whose it is (server/api/owners.py)
        self.started_at = int(time.time())
        self.completed_at = 0            # unix seconds once done
        self.buffer = bytearray()
        self.dropped = 0                 # bytes cut from the front (MAX_BYTES)
        self.done = False
        self.cancelled = cancelled       # set by a stop: the stream's request ends
        self._grew = asyncio.Event()

    @property
    def total(self) -> int:
        return self.dropped + len(self.buffer)

    def append(self, data: bytes) -> None:
        if self.done or not data:
            return
        self.buffer += data
        if len(self.buffer) > MAX_BYTES:
            cut = len(self.buffer) - MAX_BYTES
            del self.buffer[:cut]
            self.dropped += cut
        self._wake()

    def finish(self) -> None:
        if not self.done:
            self.done, self.completed_at = True, int(time.time())
            self._wake()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = asyncio.Event()

    async def read_from(self, offset: int):
        """The bytes from `offset` on, as they come, until the session ends."""
        while True:
            if offset < self.dropped:
                return                   # cut by the cap while this reader lagged
            if offset < self.total:
                chunk = bytes(self.buffer[offset - self.dropped:])
                offset += len(chunk)
                yield chunk
                continue
            if self.done:
                return
            await self._grew.wait()


class StreamSessions:
    """Every session, by owner and conversation id; owned by the app (server/app.py).
    owner_of(headers): whose a request is (server/api/owners.py owner)."""

    def __init__(self, owner_of=lambda headers: ""):
        self.owner_of = owner_of
        self._by_id: dict[tuple[str, str], Session] = {}

    def open(self, conv_id: str, cancelled: asyncio.Event, owner: str = "") -> Session:
        self._collect()
        old = self._by_id.pop((owner, conv_id), None)
        if old is not None:
            old.cancelled.set()
            old.finish()
        s = self._by_id[owner, conv_id] = Session(conv_id, cancelled, owner)
        return s

    def get(self, conv_id: str, owner: str = "") -> Session | None:
        self._collect()
        return self._by_id.get((owner, conv_id))

    def stop(self, conv_id: str, owner: str = "") -> None:
        s = self._by_id.pop((owner, conv_id), None)
        if s is not None:
            s.cancelled.set()
            s.finish()

    def matching(self, ids: list[str], owner: str = "") -> list[Session]:
        self._collect()
        return [s for i in ids for s in self._by_id.values()
                if s.owner == owner and (s.conv_id == i or s.conv_id.startswith(i + "::"))]

    def _collect(self) -> None:
        cutoff = time.time() - TTL_SECONDS
        ended = sorted((s for s in self._by_id.values() if s.done), key=lambda s: s.completed_at)
        extra = len(self._by_id) - MAX_SESSIONS
        for i, s in enumerate(ended):
            if s.completed_at <= cutoff or i < extra:
                self._by_id.pop((s.owner, s.conv_id), None)


class StreamResume:
    """ASGI middleware: tees an SSE answer to its session, and keeps it running when its
    client goes (the app sees the disconnect only when the session is stopped)."""

    def __init__(self, app, sessions: StreamSessions):
        self.app = app
        self.sessions = sessions

    async def __call__(self, scope, receive, send):
        conv_id = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                        if k == b"x-conversation-id"), "") if scope["type"] == "http" else ""
        if not conv_id or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        session: Session | None = None
        client_gone = False
        stopped = asyncio.Event()         # the session's `cancelled`, made before it exists
        ended = False                     # the answer's last body message went out

        async def tee(message):
            nonlocal session, client_gone, ended
            if message["type"] == "http.response.start":
                ctype = next((v for k, v in message.get("headers", ()) if k.lower() == b"content-type"), b"")
                if message["status"] == 200 and ctype.startswith(b"text/event-stream"):
                    # only an answer that streams has one (so only a request the API key let in)
                    session = self.sessions.open(conv_id, stopped, self.sessions.owner_of(Headers(scope=scope)))
            elif session is not None and message["type"] == "http.response.body":
                session.append(message.get("body", b""))
                ended = ended or not message.get("more_body", False)
            if not client_gone:
                try:
                    await send(message)
                except OSError:
                    client_gone = True

        async def hold_disconnect():
            nonlocal client_gone
            message = await receive()
            if message["type"] != "http.disconnect" or session is None:
                return message
            client_gone = True
            await stopped.wait()                # generation goes on into the session until stopped
            return message

        async def watch():
            """The client's messages, or a disconnect once the session is stopped. (The app may
            start waiting before its answer starts, so before the session exists.)"""
            if stopped.is_set():
                return {"type": "http.disconnect"}
            got = asyncio.ensure_future(hold_disconnect())
            stop = asyncio.ensure_future(stopped.wait())
            await asyncio.wait({got, stop}, return_when=asyncio.FIRST_COMPLETED)
            if got.done():
                stop.cancel()
                return got.result()
            got.cancel()
            return {"type": "http.disconnect"}

        try:
            await self.app(scope, watch, tee)
            if session is not None and stopped.is_set() and not ended and not client_gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})  # a clean end
        finally:
            if session is not None:
                session.finish()


def routes(sessions: StreamSessions, route) -> list:
    def conv_id(request: Request) -> str:
        cid = request.query_params.get("conv_id", "")
        if not cid:
            raise invalid("Missing conversation id in path", param="conv_id")
        return cid

    async def replay(request: Request) -> Response:
        session = sessions.get(conv_id(request), sessions.owner_of(request.headers))
        if session is None:
            raise APIError(404, "Stream not found or expired")
        try:
            start = int(request.query_params.get("from", "0"))
        except ValueError:
            raise invalid("Invalid 'from' offset", param="from")
        if start < session.dropped or start < 0:
            raise invalid("Stream offset lost, please restart", param="from")
        return StreamingResponse(session.read_from(start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def lookup(request: Request) -> Response:
        body = await route.api.json_body(request)       # every route's body checks (size, nesting, UTF-8)
        ids = body.get("conversation_ids") if isinstance(body, dict) else None
        ids = [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []
        return JSONResponse([{"conversation_id": s.conv_id, "is_done": s.done, "total_bytes": s.total,
                              "started_at": s.started_at, "completed_at": s.completed_at}
                             for s in sessions.matching(ids, sessions.owner_of(request.headers))])

    async def stop(request: Request) -> Response:
        sessions.stop(conv_id(request), sessions.owner_of(request.headers))
        return Response(status_code=204)

    return [route("/v1/stream", replay, ["GET"], "stream_replay"),
            route("/v1/stream", stop, ["DELETE"], "stream_stop"),
            route("/v1/streams/lookup", lookup, ["POST"], "streams_lookup")]
