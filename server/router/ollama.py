"""Ollama's API over the router's models: /api/tags, /api/ps, /api/show and /api/version
answered here (from the GGUF files and the models' states), /api/chat, /api/generate,
/api/embed and /api/embeddings passed to the model they name (`name:tag`, `:latest`
implied) with its `keep_alive` kept: a duration or seconds to stay loaded once answered,
0 to unload at once, negative to stay. A request with no prompt only loads (or, with
keep_alive 0, unloads) its model, as Ollama's clients use it."""
from __future__ import annotations

import datetime
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.native.gguf_file import GGUFError, GGUFFile
from ggserve.server.api.errors import APIError
from ggserve.server.api.ollama.convert import error_response, keep_alive_seconds, model_id, now_iso
from ggserve.server.api.ollama.info import _INSTEAD, VERSION, show_answer, tag_entry
from ggserve.server.router.child import LoadFailed


def _flag_value(args: list[str], *names: str) -> str | None:
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a in names), None)


def _gguf(model):
    try:
        return GGUFFile(model.spec.path) if model.spec.path else None
    except (GGUFError, OSError):
        return None


def _expiry(model) -> str:
    if model.expires_at is None:
        return "2318-08-20T00:00:00Z"            # Ollama's "forever" is as far off
    at = time.time() + (model.expires_at - time.monotonic())
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat()


def ollama_routes(api) -> list[tuple]:
    """(path, endpoint, methods) of Ollama's API on the router; errors in Ollama's shape."""
    registry = api.registry

    def shaped(fn):
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(request)
            except APIError as e:
                return error_response(e)
        return endpoint

    def named(name) -> object:
        ids = [mid for mid, m in registry.models.items() if not m.spec.hidden] + list(registry.models)
        mid = model_id(name, ids) if isinstance(name, str) and name else None
        if mid is None:
            raise APIError(404, f"model '{name}' not found")
        return registry.models[mid]

    async def tags(request: Request) -> Response:
        out = []
        for mid, m in registry.models.items():
            gguf = None if m.spec.hidden else _gguf(m)
            if gguf is not None:
                out.append(tag_entry(mid, m.spec.path, gguf))
        return JSONResponse({"models": out})

    async def ps(request: Request) -> Response:
        out = []
        for mid, m in registry.models.items():
            gguf = _gguf(m) if m.status == "loaded" else None
            if gguf is not None:
                out.append({**tag_entry(mid, m.spec.path, gguf), "expires_at": _expiry(m), "size_vram": 0,
                            "context_length": int(_flag_value(m.spec.args + registry.child_args, "-c", "--ctx-size") or 0)})
        return JSONResponse({"models": out})

    async def show(request: Request) -> Response:
        _, body = await api.body(request)
        model = named(body.get("model") or body.get("name"))
        gguf = _gguf(model)
        if gguf is None:
            raise APIError(500, f"model '{model.spec.id}': its file cannot be read")
        args = model.spec.args + registry.child_args
        return JSONResponse(show_answer(gguf, model.spec.path, _flag_value(args, "--mmproj", "-mm"),
                                        "--embeddings" in args or "--embedding" in args, bool(body.get("verbose"))))

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VERSION})

    async def run(request: Request) -> Response:
        raw, body = await api.body(request)
        model = named(body.get("model"))
        keep = keep_alive_seconds(body.get("keep_alive"))
        key = {"/api/chat": "messages", "/api/generate": "prompt"}.get(request.url.path)
        if key and not body.get(key) and not body.get("images"):
            return await _load_only(model, keep, key, body.get("model"))
        return await api.serve_with(request, model, raw, api.autoload(request), keep_alive=keep)

    async def _load_only(model, keep, key, name) -> Response:
        if keep == 0:
            if model.running:
                await registry.unload(model)
            reason = "unload"
        else:
            try:
                await registry.acquire(model)
            except LoadFailed as e:
                raise APIError(500, f"model '{model.spec.id}' failed to load: {e}") from None
            registry.keep_alive(model, keep)
            registry.release(model)
            reason = "load"
        empty = {"role": "assistant", "content": ""} if key == "messages" else ""
        return JSONResponse({"model": name, "created_at": now_iso(), "message" if key == "messages" else "response": empty,
                             "done": True, "done_reason": reason})

    def refused(what):
        async def endpoint(request: Request) -> Response:
            raise APIError(501, f"/api/{what} is not served: ggserve does not download or store models; "
                                f"{_INSTEAD[what]}")
        return endpoint

    out = [("/api/tags", tags, ["GET"]), ("/api/ps", ps, ["GET"]), ("/api/version", version, ["GET"]),
           ("/api/show", show, ["POST"])]
    out += [(p, run, ["POST"]) for p in ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings")]
    out += [(f"/api/{w}", refused(w), ["DELETE" if w == "delete" else "POST"]) for w in _INSTEAD]
    return [(p, shaped(fn), m) for p, fn, m in out]
