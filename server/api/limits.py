"""What a request may carry and how long a client may stall: the body size limit
(413), JSON that is valid UTF-8 with bounded nesting and no lone surrogates (400),
large bodies parsed off the event loop, the constant-time API key check, and the
write timeout of streamed responses (--timeout)."""
from __future__ import annotations

import asyncio
import hmac
import json
import json.scanner
import logging

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ggserve.server.api.errors import APIError, invalid

log = logging.getLogger("ggserve.server")

MAX_DEPTH = 64                  # nested arrays/objects in a body (tool schemas need ~10)
OFF_LOOP_BYTES = 256 * 1024     # bodies at least this big are parsed on a worker thread


def too_large(limit: int) -> APIError:
    return APIError(413, f"Request body is larger than the server's limit of {limit} bytes "
                         f"(--max-body-mb)", code="request_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` bytes (before reading
    it all when Content-Length says so)."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > limit:
        raise too_large(limit)
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise too_large(limit)
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body        # later request.body() calls see it (starlette caches it there)
    return body


def _stepwise_decoder() -> json.JSONDecoder:
    """A decoder whose object/array scanner is Python code: it lets other threads (the
    event loop) run between values, where the C scanner holds the GIL for a whole body
    (0.4 s for a 100,000-message chat). Strings are still scanned in C."""
    dec = json.JSONDecoder()
    dec.scan_once = json.scanner.py_make_scanner(dec)
    return dec


def parse_json(raw: bytes, stepwise: bool = False) -> object:
    """raw -> JSON value; every malformed body is an APIError 400."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"Request body is not valid UTF-8: {e}") from None
    try:
        value = _stepwise_decoder().decode(text) if stepwise else json.loads(text)
    except json.JSONDecodeError as e:
        raise invalid(f"Invalid JSON in request body: {e}") from None
    except RecursionError:
        raise invalid(f"JSON nesting is deeper than {MAX_DEPTH} levels") from None
    check_value(value)
    return value


def check_value(value: object) -> None:
    """Bounded nesting and strings that are Unicode text (a lone UTF-16 surrogate
    escape such as "\\ud800" parses, but no later layer can encode it)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items = list(v.items())
            stack.extend((k, depth) for k, _ in items)
            stack.extend((x, depth + 1) for _, x in items)
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    raise invalid("A JSON string holds a lone UTF-16 surrogate "
                                  "(\\ud800-\\udfff not in a pair)") from None
            continue
        else:
            continue
        if depth > MAX_DEPTH:
            raise invalid(f"JSON nesting is deeper than {MAX_DEPTH} levels")


async def json_object(request: Request, limit: int) -> dict:
    """A request's JSON object body; big ones are parsed off the event loop."""
    raw = await read_body(request, limit)
    if not raw.strip():
        raise invalid("Request body is empty; expected a JSON object")
    if len(raw) >= OFF_LOOP_BYTES:
        body = await asyncio.to_thread(parse_json, raw, True)
    else:
        body = parse_json(raw)
    if not isinstance(body, dict):
        raise invalid("Request body must be a JSON object")
    return body


def check_messages(body: dict, n_ctx: int) -> None:
    """A chat with more messages than its context has tokens cannot fit (each message
    renders to at least one token): refused before validating and templating it."""
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > n_ctx:
        raise invalid(f"{len(messages)} messages cannot fit the context of {n_ctx} tokens",
                      param="messages", code="context_length_exceeded")


def key_matches(key: str, keys: list[str]) -> bool:
    """Constant-time over every key: no early exit on the first match."""
    given = key.encode("utf-8", "surrogatepass")
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(given, k.encode("utf-8"))
    return ok


class TimedStreamingResponse(StreamingResponse):
    """A stream whose client stops reading for `timeout` seconds is ended: the
    write raises, the body generator is closed (which cancels its engine job and
    frees its KV cells) and the connection is dropped."""

    def __init__(self, *args, timeout: float | None = None, **kw):
        super().__init__(*args, **kw)
        self.timeout = timeout

    async def __call__(self, scope, receive, send) -> None:
        app = scope.get("app")
        timeout = self.timeout or getattr(getattr(getattr(app, "state", None), "config", None),
                                          "timeout", None)
        if not timeout:
            return await super().__call__(scope, receive, send)

        stalled = False

        async def timed_send(message) -> None:
            nonlocal stalled
            try:
                await asyncio.wait_for(send(message), timeout)
            except asyncio.TimeoutError:
                stalled = True
                raise OSError("client stopped reading") from None

        try:
            await super().__call__(scope, receive, timed_send)
        except Exception:
            if not stalled:
                raise
            log.warning("ended a stream whose client did not read for %g s (--timeout)", timeout)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def add_limit_flags(p, flag) -> None:
    """The command line's flags for these limits (server/cli/serve_flags.py's _flag)."""
    flag(p, "--max-body-mb", env="GGSERVE_MAX_BODY_MB", type=float, default=64, metavar="MB",
         dest="max_body_mb", help="largest request body accepted (larger: 413)")
    flag(p, "-to", "--timeout", env="LLAMA_ARG_TIMEOUT", type=float, default=600, metavar="N",
         help="seconds a client may stop reading its stream before it is ended and its slot freed")
    flag(p, "--shutdown-timeout", env="GGSERVE_SHUTDOWN_TIMEOUT", type=float, default=10, metavar="S",
         dest="shutdown_timeout", help="on SIGTERM: seconds requests may finish (new ones: 503); then exit 0")
