"""The HTTP API: a Starlette app serving OpenAI's endpoints on top of Service.

Routes (all listed at /openapi.json, server/api/openapi.py): /v1/chat/completions,
/v1/completions (server/api/openai/generation.py),
/completion, /completions (llama-server's native shape: server/api/llama/completion.py), /infill
(server/api/llama/infill.py),
/v1/responses (server/api/openai/responses.py), /v1/messages (server/api/anthropic/messages.py),
/v1/embeddings, /embeddings, /embedding (server/api/openai/embeddings.py), /rerank and its
aliases (server/api/llama/rerank.py),
/v1/models, /health, /metrics, /tokenize, /detokenize (server/api/common.py), /slots
(server/api/llama/slots.py), and the
same without /v1 where llama-server has them, /props and the chat page at /
(server/api/llama/chat_page.py), /v1/stream and /v1/streams/lookup (server/api/stream_resume.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from ggserve.server.agent_tools.config import AgentToolsConfig
from ggserve.server.api import stream_resume
from ggserve.server.api.anthropic import messages as anthropic_api
from ggserve.server.api.common import API
from ggserve.server.api.cors import CORS
from ggserve.server.api.errors import exception_handlers
from ggserve.server.api.llama import chat_page, completion as native_api, cors_proxy, tools as tools_api
from ggserve.server.api.llama.infill import infill
from ggserve.server.api.llama.lora import routes as lora_routes
from ggserve.server.api.llama.rerank import rerank
from ggserve.server.api.llama.slots import SlotsAPI
from ggserve.server.api.media import MediaConfig
from ggserve.server.api.ollama import info as ollama_api
from ggserve.server.api.openai import responses as responses_api, transcriptions
from ggserve.server.api.openai.embeddings import embeddings_native, embeddings_oai
from ggserve.server.api.openai.generation import apply_template, chat, chat_input_tokens, completions
from ggserve.server.api.openapi import openapi
from ggserve.server.api.owners import owner
from ggserve.server.api.prefix import ApiPrefix
from ggserve.server.api.request_limits import RequestLimits
from ggserve.server.api.routing import Router
from ggserve.server.api.stream_resume import StreamResume, StreamSessions
from ggserve.server.api.vertex import predict as gcp_api
from ggserve.server.engine.config import EngineConfig
from ggserve.server.service.metrics import Metrics
from ggserve.server.service.service import Service
from ggserve.server.service.sleep import Sleeper

log = logging.getLogger("ggserve.server")


@dataclass
class ServerConfig(EngineConfig):
    """What `ggserve serve` runs with: the engine's config and what only the HTTP side reads."""

    alias: str | None = None
    api_keys: list[str] = field(default_factory=list)
    cache_isolation: str = "none"             # --cache-isolation: key: a prompt cache per API key (api/owners.py)
    metrics: bool = False
    cors_origins: list[str] = field(default_factory=lambda: ["*"])
    max_queue: int = 64
    slots_endpoint: bool = True               # GET /slots (--no-slots)
    props_endpoint: bool = False              # POST /props (--props)
    slot_save_path: str | None = None         # POST /slots/{id}?action=save|restore|erase
    media: MediaConfig = field(default_factory=MediaConfig)
    webui: bool = True
    reasoning_format: str = "auto"            # none | deepseek | auto
    reasoning_budget: int = -1                # 0: no thinking
    chat_template_kwargs: dict = field(default_factory=dict)
    embd_normalize: int = 2                   # --embd-normalize: a request's default
    max_body_bytes: int = 64 * 2**20          # --max-body-mb: larger request bodies get 413
    limits: RequestLimits = field(default_factory=RequestLimits)   # --grammar-max-*, --schema-max-*, --max-*
    sampling_defaults: dict = field(default_factory=dict)   # --temp, --top-k, ..., --seed: a request's defaults
    ignore_eos: bool = False                  # --ignore-eos: a request's default
    n_keep: int = 0                           # --keep: what a context shift keeps of a prompt
    api_prefix: str = ""                      # --api-prefix: "" or "/name": every path under it
    default_grammar: tuple | None = None      # --grammar / --json-schema: (kind, text), a request's default
    verbose: bool = False                     # -v: chat answers carry __verbose unless a request says not
    tags: tuple[str, ...] = ()                # --tags: shown in /v1/models
    n_predict: int = -1                       # -n: a request's default token limit (-1: none)
    timeout: float = 600.0                    # -to/--timeout: a stream's client may stall this long
    sleep_idle_seconds: float = -1            # free the model after this long idle (-1: never; server/service/sleep.py)
    agent: AgentToolsConfig = field(default_factory=AgentToolsConfig)   # /tools, /cors-proxy (server/agent_tools/)


def load_engine(cfg: ServerConfig):
    """Build the engine (slow: loads weights); logs progress and the memory report."""
    from ggserve.server.engine.engine import Engine

    t0 = time.perf_counter()
    log.info("loading model %s (n_ctx=%d, n_parallel=%d, n_batch=%d, n_gpu_layers=%d)",
             cfg.model, cfg.n_ctx, cfg.n_parallel, cfg.n_batch, cfg.n_gpu_layers)
    engine = Engine(cfg)
    log.info("model %r loaded in %.1f s", engine.model_name, time.perf_counter() - t0)
    report = engine.memory_report()
    if report:
        log.info("memory:\n%s", report)
    return engine


def create_app(cfg: ServerConfig, *, engine_loader: Callable[[], Any] | None = None,
               make_request=None, make_decoder=None, make_prompts=None) -> Starlette:
    """Build the app. The engine loads in the background once the app starts
    (/health answers 503 until it is ready)."""
    metrics = Metrics()
    service = Service(engine_loader or (lambda: load_engine(cfg)),
                      n_parallel=cfg.n_parallel, max_queue=cfg.max_queue,
                      metrics=metrics, make_request=make_request,
                      make_decoder=make_decoder,
                      **({"make_prompts": make_prompts} if make_prompts else {}))
    service.default_max_tokens = cfg.n_predict
    api = API(cfg, service, metrics)
    if cfg.sleep_idle_seconds > 0:
        from ggserve.server.api.llama.props import props
        api.sleeper = Sleeper(service, cfg.sleep_idle_seconds, lambda: props(api))
    sessions = StreamSessions(functools.partial(owner, api_keys=cfg.api_keys))   # streams under X-Conversation-Id
    toolbox = cfg.agent.toolbox()                     # None: /tools answers 403
    routes = _routes(api, Router(api), sessions)
    routes += tools_api.routes(api, Router(api), toolbox) + cors_proxy.routes(Router(api), cfg.agent.cors_proxy)
    app = Starlette(routes=routes, middleware=_middleware(cfg, sessions),
                    lifespan=_lifespan(service, api.sleeper, toolbox), exception_handlers=exception_handlers)
    app.state.service = service
    app.state.metrics = metrics
    app.state.config = cfg
    return app


def _routes(api: API, route: Router, sessions: StreamSessions) -> list[Route]:
    cfg, routes = api.cfg, []
    for paths, fn, methods, name in [
        (("/health", "/v1/health"), api.health, ["GET"], "health"),
        (("/v1/models", "/models"), api.models, ["GET"], "models"),
        (("/metrics",), api.metrics_endpoint, ["GET"], "metrics"),
        (("/v1/chat/completions", "/chat/completions"), functools.partial(chat, api), ["POST"], "chat"),
        (("/v1/completions",), functools.partial(completions, api), ["POST"], "completions"),
        (("/completion", "/completions"), functools.partial(native_api.completion, api), ["POST"], "completion"),
        (("/infill",), functools.partial(infill, api), ["POST"], "infill"),
        (("/apply-template",), functools.partial(apply_template, api), ["POST"], "apply_template"),
        (("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"),
         functools.partial(chat_input_tokens, api), ["POST"], "chat_input_tokens"),
        (("/tokenize",), api.tokenize, ["POST"], "tokenize"),
        (("/v1/embeddings",), functools.partial(embeddings_oai, api), ["POST"], "embeddings"),
        (("/embeddings", "/embedding"), functools.partial(embeddings_native, api), ["POST"], "embeddings"),
        (("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"), functools.partial(rerank, api), ["POST"],
         "rerank"),
        (("/detokenize",), api.detokenize, ["POST"], "detokenize"),
        (("/openapi.json",), openapi, ["GET"], "openapi"),
    ]:
        routes += [route(p, fn, methods, name) for p in paths]
    slots = SlotsAPI(api, cfg.slots_endpoint, cfg.slot_save_path)
    routes += [route("/slots", slots.list, ["GET"], "slots"),
               route("/slots/{id_slot}", slots.action, ["POST"], "slots_action")]
    routes += lora_routes(api, route)                # /lora-adapters
    routes += responses_api.routes(api, route)       # /v1/responses
    routes += transcriptions.routes(api, route)      # /v1/audio/transcriptions
    routes += anthropic_api.routes(api, route)       # /v1/messages
    routes += ollama_api.routes(api, route)          # Ollama's /api/...
    routes += chat_page.routes(api, route, page=cfg.webui)  # /props, and the chat page at /
    routes += stream_resume.routes(sessions, route)           # /v1/stream, /v1/streams/lookup
    routes += gcp_api.routes(routes, route, api.health)      # /predict, with AIP_MODE=PREDICTION
    return routes


def _lifespan(service: Service, sleeper: Sleeper | None, toolbox=None):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await service.start()                    # the model loads in the background
        if toolbox is not None:                  # meanwhile MCP servers list their tools, before the port opens
            await toolbox.start()
        if sleeper is not None:
            sleeper.start()
        try:
            yield
        finally:
            if sleeper is not None:
                await sleeper.stop()
            await asyncio.gather(service.close(), *([toolbox.close()] if toolbox is not None else []))
    return lifespan


def _middleware(cfg: ServerConfig, sessions: StreamSessions) -> list[Middleware]:
    middleware = []
    if cfg.cors_origins:
        middleware.append(Middleware(CORS, origins=cfg.cors_origins))     # server/api/cors.py: as llama-server
    middleware.append(Middleware(StreamResume, sessions=sessions))       # server/api/stream_resume.py
    if cfg.api_prefix:                                                    # server/api/prefix.py, outermost
        middleware.insert(0, Middleware(ApiPrefix, prefix=cfg.api_prefix))
    return middleware
