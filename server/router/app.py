"""The router's HTTP side: its own endpoints (/models, /v1/models, /models/load, /models/unload,
/props, /health) and every other request passed to the model it names: the body's `model`
(POST) or `?model=` (GET), as llama-server 11434's router mode routes them."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggserve.server.api.anthropic.items import error_response as anthropic_error
from ggserve.server.api.cors import CORS
from ggserve.server.api.errors import APIError, exception_handlers
from ggserve.server.api.limits import key_matches
from ggserve.server.api.owners import presented_key
from ggserve.server.router.child import LoadFailed
from ggserve.server.router.ollama import ollama_routes
from ggserve.server.router.proxy import Proxy
from ggserve.server.router.registry import FAKE_DELAY, Model, Registry

BUILD_INFO = "b11434-ggserve"           # llama-server's build_info starts with "b<build>"
_PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}


@dataclass
class RouterConfig:
    models_max: int = 4
    autoload: bool = True
    api_keys: list[str] = field(default_factory=list)
    cors_origins: list[str] = field(default_factory=lambda: ["*"])
    max_body_bytes: int = 64 * 2**20


class RouterAPI:
    def __init__(self, cfg: RouterConfig, registry: Registry, reload_specs=None):
        self.cfg, self.registry, self.reload_specs = cfg, registry, reload_specs
        self.proxy = Proxy()

    # -- what every request goes through -------------------------------------------------

    def check_auth(self, request: Request) -> None:
        if not self.cfg.api_keys or request.url.path in _PUBLIC:
            return
        key = presented_key(request.headers)
        if not key or not key_matches(key, self.cfg.api_keys):
            raise APIError(401, "Invalid API Key", code=401)

    def model(self, name: str | None) -> Model:
        if not name:
            raise APIError(400, "model name is missing from the request")
        model = self.registry.get(name)
        if model is None:
            raise APIError(400, f"model '{name}' not found")
        return model

    def autoload(self, request: Request) -> bool:
        flag = request.query_params.get("autoload")
        return self.cfg.autoload if flag is None else flag in ("true", "1")

    async def body(self, request: Request) -> tuple[bytes, dict]:
        raw = await request.body()
        if len(raw) > self.cfg.max_body_bytes:
            raise APIError(413, "request body too large")
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError as e:
            raise APIError(400, f"the body is not JSON: {e}") from None
        return raw, parsed if isinstance(parsed, dict) else {}

    async def serve_with(self, request: Request, model: Model, raw: bytes, autoload: bool,
                         path: str | None = None, keep_alive: float | None = None) -> Response:
        """Pass the request to the model's child, loading it first if it may; once answered, the
        model stays loaded for keep_alive seconds (None: until evicted or unloaded)."""
        if not autoload and model.status != "loaded":
            raise APIError(400, "model is not loaded")
        try:
            await self._acquire_while_connected(request, model)
        except LoadFailed as e:
            raise APIError(503, f"model '{model.spec.id}' failed to load: {e}", code="model_load_failed") from None
        try:
            if FAKE_DELAY:
                await asyncio.sleep(FAKE_DELAY)
            child = model.child
            if child is None:
                raise APIError(503, f"model '{model.spec.id}' is not running: {model.failure}")
        except BaseException:
            self.registry.release(model)
            raise

        def done():
            self.registry.keep_alive(model, keep_alive)
            self.registry.release(model)
        return await self.proxy.forward(request, child.url, raw, done, path)

    async def _acquire_while_connected(self, request: Request, model: Model) -> None:
        """Wait for the model; a client that leaves meanwhile leaves the queue too, so no model
        is unloaded for nobody (llama.cpp's test_router_queue_client_disconnect_keeps_model)."""
        async def gone():
            while (await request.receive())["type"] != "http.disconnect":
                pass

        acquire = asyncio.ensure_future(self.registry.acquire(model))
        watch = asyncio.ensure_future(gone())
        try:
            await asyncio.wait({acquire, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not acquire.done():
                acquire.cancel()
            await asyncio.gather(watch, acquire, return_exceptions=True)
        if acquire.cancelled():
            raise APIError(400, "the client left while its model was loading")
        acquire.result()

    # -- endpoints ---------------------------------------------------------------------

    async def forward(self, request: Request) -> Response:
        """Any endpoint of the model the request names; the router's errors in the shape of the
        API asked (Anthropic's for /v1/messages, OpenAI's otherwise)."""
        try:
            return await self._forward(request)
        except APIError as e:
            if request.url.path.startswith("/v1/messages"):
                return anthropic_error(e)
            raise

    async def _forward(self, request: Request) -> Response:
        if request.method in ("GET", "HEAD", "DELETE"):
            raw, name = b"", request.query_params.get("model")
        else:
            raw, body = await self.body(request)
            name = body.get("model") if isinstance(body.get("model"), str) else None
        return await self.serve_with(request, self.model(name), raw, self.autoload(request))

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def props(self, request: Request) -> Response:
        if request.query_params.get("model") or request.method != "GET":
            return await self.forward(request)
        return JSONResponse({
            "role": "router", "max_instances": self.cfg.models_max, "models_autoload": self.cfg.autoload,
            "model_alias": "ggserve", "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0}, "build_info": BUILD_INFO})

    async def models(self, request: Request) -> Response:
        if request.query_params.get("reload") and self.reload_specs is not None:
            self.registry.replace_specs(self.reload_specs())
        now = int(time.time())
        data = [model_entry(m, now) for m in self.registry.models.values() if not m.spec.hidden]
        return JSONResponse({"object": "list", "data": data})

    async def load(self, request: Request) -> Response:
        _, body = await self.body(request)
        model = self.registry.get(body.get("model") or "")
        if model is None:
            raise APIError(404, "model is not found")
        if model.running:
            raise APIError(400, "model is already running")
        self.registry.request_load(model.spec.id)
        return JSONResponse({"success": True})

    async def unload(self, request: Request) -> Response:
        _, body = await self.body(request)
        model = self.registry.get(body.get("model") or "")
        if model is None:
            raise APIError(400, "model is not found")
        if not model.running:
            raise APIError(400, "model is not running")
        asyncio.ensure_future(self.registry.unload(model))
        return JSONResponse({"success": True})


def model_entry(m: Model, now: int) -> dict:
    """One model of GET /models as llama-server lists it: its status, and why it failed."""
    status: dict = {"value": m.status, "args": ["ggserve", "serve", *m.spec.args]}
    if m.status == "failed":
        status.update(failed=True, exit_code=m.exit_code, reason=m.failure)
    return {"id": m.spec.id, "aliases": [], "tags": [], "object": "model", "owned_by": "ggserve",
            "created": now, "status": status, "source": m.spec.source, "path": m.spec.path,
            "can_remove": False}


def guarded(api: RouterAPI, fn):
    async def endpoint(request: Request) -> Response:
        api.check_auth(request)
        return await fn(request)
    return endpoint


def router_routes(api: RouterAPI) -> list[Route]:
    own = [(("/health", "/v1/health"), api.health, ["GET"]),
           (("/models", "/v1/models"), api.models, ["GET"]),
           (("/models/load",), api.load, ["POST"]),
           (("/models/unload",), api.unload, ["POST"]),
           (("/props",), api.props, ["GET", "POST"])]
    routes = [Route(p, guarded(api, fn), methods=m) for paths, fn, m in own for p in paths]
    return routes


def create_router_app(cfg: RouterConfig, registry: Registry, reload_specs=None) -> Starlette:
    """The router app: its own endpoints, Ollama's (server/router/ollama.py), the rest passed on."""
    api = RouterAPI(cfg, registry, reload_specs)
    routes = router_routes(api)
    routes += [Route(p, guarded(api, fn), methods=m) for p, fn, m in ollama_routes(api)]
    routes.append(Route("/{path:path}", guarded(api, api.forward),
                        methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        reaper = asyncio.ensure_future(registry.reap())
        for m in list(registry.models.values()):
            if m.spec.load_on_startup:
                registry.request_load(m.spec.id)
        try:
            yield
        finally:
            reaper.cancel()
            await registry.close()
            await api.proxy.close()

    from starlette.middleware import Middleware
    middleware = [Middleware(CORS, origins=cfg.cors_origins)] if cfg.cors_origins else []
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware, exception_handlers=exception_handlers)
    app.state.registry, app.state.router_api = registry, api
    return app
