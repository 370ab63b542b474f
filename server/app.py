"""The HTTP API: a Starlette app serving OpenAI's endpoints on top of Service.

Routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics,
/tokenize, /detokenize (and the same without /v1 where llama-server has them),
/props and the chat page at / (server/chat_page.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import schemas as S
from . import chat_page
from .errors import APIError, exception_handlers, invalid, model_not_found, to_api_error
from .media import MediaConfig, MediaError, load_image
from .metrics import Metrics
from .service import Job, Service

log = logging.getLogger("ggserve.server")

# Reachable without the API key, as in llama-server.
_PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}


@dataclass
class ServerConfig:
    model: str
    alias: str | None = None
    n_ctx: int = 4096
    n_batch: int = 512
    n_parallel: int = 4
    n_threads: int = 0
    n_gpu_layers: int = 0
    api_keys: list[str] = field(default_factory=list)
    metrics: bool = False
    cors_origins: list[str] = field(default_factory=lambda: ["*"])
    max_queue: int = 64
    chat_template_file: str | None = None
    mmproj: str | None = None
    image_cache_mb: int = 256
    max_stall_ms: float = 0.0
    media: MediaConfig = field(default_factory=MediaConfig)
    webui: bool = True


def load_engine(cfg: ServerConfig):
    """Build the engine (slow: loads weights); logs progress and the memory report."""
    from .engine import Engine

    t0 = time.perf_counter()
    log.info("loading model %s (n_ctx=%d, n_parallel=%d, n_batch=%d, n_gpu_layers=%d)",
             cfg.model, cfg.n_ctx, cfg.n_parallel, cfg.n_batch, cfg.n_gpu_layers)
    template = None
    if cfg.chat_template_file:
        with open(cfg.chat_template_file, encoding="utf-8") as f:
            template = f.read()
    engine = Engine(cfg.model, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
                    n_parallel=cfg.n_parallel, n_threads=cfg.n_threads,
                    n_gpu_layers=cfg.n_gpu_layers, chat_template=template,
                    mmproj=cfg.mmproj, image_cache_mb=cfg.image_cache_mb,
                    max_stall_ms=cfg.max_stall_ms)
    log.info("model %r loaded in %.1f s", engine.model_name, time.perf_counter() - t0)
    report = engine.memory_report()
    if report:
        log.info("memory:\n%s", report)
    return engine


class _API:
    def __init__(self, cfg: ServerConfig, service: Service, metrics: Metrics):
        self.cfg = cfg
        self.service = service
        self.metrics = metrics
        self.media = cfg.media

    # -- helpers ------------------------------------------------------------------

    @property
    def engine(self):
        if not self.service.ready:
            if self.service.load_error is not None:
                raise APIError(500, f"Model failed to load: {self.service.load_error}")
            raise APIError(503, "Loading model", code="model_loading",
                           headers={"Retry-After": "5"})
        return self.service.engine

    def model_id(self) -> str:
        if self.cfg.alias:
            return self.cfg.alias
        if self.service.ready:
            return self.service.engine.model_name
        return os.path.splitext(os.path.basename(self.cfg.model))[0]

    def check_model(self, name: str | None) -> None:
        if not name:
            return
        known = {self.model_id(), self.cfg.model, os.path.basename(self.cfg.model),
                 os.path.splitext(os.path.basename(self.cfg.model))[0]}
        if self.service.ready:
            known.add(self.service.engine.model_name)
        if name not in known:
            raise model_not_found(name)

    def check_auth(self, request: Request) -> None:
        if not self.cfg.api_keys or request.url.path in _PUBLIC:
            return
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else \
            request.headers.get("x-api-key", "")
        if not key:
            raise APIError(401, "Missing API key: send `Authorization: Bearer <key>`",
                           code="invalid_api_key")
        if key not in self.cfg.api_keys:
            raise APIError(401, "Invalid API key", code="invalid_api_key")

    @staticmethod
    async def json_body(request: Request) -> dict:
        raw = await request.body()
        if not raw.strip():
            raise invalid("Request body is empty; expected a JSON object")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise invalid(f"Invalid JSON in request body: {e}")
        if not isinstance(body, dict):
            raise invalid("Request body must be a JSON object")
        return body

    def sampling(self, req: S._Sampling, n_probs: int, n: int) -> list:
        """One SamplingParams per choice (an explicit seed differs per choice)."""
        from .sampling import SamplingParams

        kw = {k: getattr(req, k) for k in (
            "temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
            "repeat_last_n", "presence_penalty", "frequency_penalty", "seed")
            if getattr(req, k) is not None}
        if req.top_p == 0.0:
            kw["top_p"] = 1e-9  # OpenAI allows 0: "only the most likely token"
        if req.typical_p == 0.0:
            kw["typical_p"] = 1e-9
        if req.logit_bias:
            n_vocab = self.engine.tokenizer.n_vocab
            bias = {}
            for key, v in req.logit_bias.items():
                tok = int(key)
                if tok >= n_vocab:
                    raise invalid(f"logit_bias: token id {tok} is out of range "
                                  f"(n_vocab={n_vocab})", param="logit_bias")
                bias[tok] = -math.inf if v <= -100 else float(v)
            kw["logit_bias"] = bias
        kw["n_probs"] = n_probs
        params = SamplingParams(**kw)
        try:
            params.validate()
        except ValueError as e:
            raise invalid(str(e))
        out = []
        for i in range(n):
            p = copy.copy(params)
            if params.seed is not None:
                p.seed = params.seed + i
            out.append(p)
        return out

    def check_n(self, n: int) -> None:
        if n > self.cfg.n_parallel:
            raise invalid(f"n must be at most {self.cfg.n_parallel} (the server's "
                          f"--parallel)", param="n")

    def logprob_tokens(self, entries) -> list[tuple[bytes, float, list[tuple[bytes, float]]]]:
        tb = self.service.engine.tokenizer.token_bytes
        return [(tb(t), lp, [(tb(u), v) for u, v in top]) for t, lp, top in entries]

    # -- endpoints --------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if self.service.ready:
            return JSONResponse({"status": "ok"})
        if self.service.load_error is not None:
            raise APIError(500, f"Model failed to load: {self.service.load_error}")
        raise APIError(503, "Loading model", code="model_loading",
                       headers={"Retry-After": "5"})

    async def models(self, request: Request) -> Response:
        meta = {"n_ctx": self.cfg.n_ctx, "n_parallel": self.cfg.n_parallel}
        if self.service.ready:
            e = self.service.engine
            meta.update(n_ctx_slot=e.n_ctx, n_vocab=e.tokenizer.n_vocab)
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_id(), "object": "model", "created": S.now(),
            "owned_by": "ggserve", "meta": meta,
        }]})

    async def metrics_endpoint(self, request: Request) -> Response:
        if not self.cfg.metrics:
            raise APIError(501, "This server does not support metrics endpoint; "
                                "start it with --metrics")
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def tokenize(self, request: Request) -> Response:
        req = S.TokenizeRequest.model_validate(await self.json_body(request))
        tok = self.engine.tokenizer
        ids = tok.encode(req.content, add_special=req.add_special,
                         parse_special=req.parse_special)
        if not req.with_pieces:
            return JSONResponse({"tokens": ids})
        pieces = []
        for i in ids:
            raw = tok.token_bytes(i)
            try:
                piece: Any = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            pieces.append({"id": i, "piece": piece})
        return JSONResponse({"tokens": pieces})

    async def detokenize(self, request: Request) -> Response:
        req = S.DetokenizeRequest.model_validate(await self.json_body(request))
        tok = self.engine.tokenizer
        bad = [t for t in req.tokens if not 0 <= t < tok.n_vocab]
        if bad:
            raise invalid(f"token id {bad[0]} is out of range", param="tokens")
        return JSONResponse({"content": tok.decode(req.tokens)})

    # chat ------------------------------------------------------------------------

    async def chat_prompt(self, req: S.ChatCompletionRequest) -> tuple[list[int], list]:
        """Messages -> (prompt tokens, image spans). Image parts are fetched/decoded
        (server/media.py), become the media marker in the rendered template, and the
        engine arranges their embedding rows as llama.cpp's mtmd does."""
        msgs, urls = [], []
        for i, m in enumerate(req.messages):
            msg: dict[str, Any] = {"role": m.role}
            if isinstance(m.content, list):
                parts = []
                for j, part in enumerate(m.content):
                    if part.type == "text":
                        if part.text is None:
                            raise invalid("text content part needs `text`",
                                          param=f"messages.{i}.content")
                        parts.append({"type": "text", "text": part.text})
                    elif part.type == "image_url":
                        url = part.image_url.get("url") if isinstance(part.image_url, dict) else part.image_url
                        if not isinstance(url, str) or not url:
                            raise invalid("image_url part needs `image_url.url`",
                                          param=f"messages.{i}.content.{j}.image_url")
                        urls.append((url, f"messages.{i}.content.{j}.image_url"))
                        parts.append({"type": "image_url"})
                    else:
                        raise invalid(f"unsupported content part type {part.type!r}",
                                      param=f"messages.{i}.content")
                msg["content"] = parts
            else:
                msg["content"] = m.content
            if m.content is None and not m.tool_calls and m.role != "assistant":
                raise invalid(f"messages.{i}.content is required for role {m.role!r}",
                              param=f"messages.{i}.content")
            if msg["content"] is None:
                msg["content"] = ""
            for k in ("name", "tool_calls", "tool_call_id"):
                if getattr(m, k) is not None:
                    msg[k] = getattr(m, k)
            msgs.append(msg)
        engine = self.engine
        if urls and engine.vision is None:
            raise invalid("this model does not support images (start the server with --mmproj)",
                          param=urls[0][1], code="images_not_supported")
        images = []
        for url, param in urls:
            try:
                loaded = await load_image(url, self.media)
            except MediaError as e:
                raise e.api_error(param) from None
            images.append((loaded.sha256, loaded.image))
        text = engine.chat_template.render(msgs, add_generation_prompt=True,
                                           tools=req.tools)
        try:
            ids, spans = await asyncio.to_thread(engine.build_prompt, text, images)
        except ValueError as e:
            raise invalid(str(e), param="messages") from None
        bos = engine.tokenizer.bos_id
        # a template that writes the BOS text itself, plus add_special: one BOS only
        if not spans and len(ids) >= 2 and bos is not None and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids, spans

    async def chat(self, request: Request) -> Response:
        req = S.ChatCompletionRequest.model_validate(await self.json_body(request))
        self.check_model(req.model)
        self.check_n(req.n)
        prompt, images = await self.chat_prompt(req)
        n_probs = max(req.top_logprobs or 0, 1) if req.logprobs else 0
        params = self.sampling(req, n_probs, req.n)
        job = await self.service.submit([prompt] * req.n, params, req.limit,
                                        ignore_eos=req.ignore_eos, stops=req.stop,
                                        images=images,
                                        turn_starts=self.service.engine.turn_starts(prompt, images))
        k = req.top_logprobs or 0
        rid, created, model = S.new_id("chatcmpl"), S.now(), self.model_id()

        def lp_entries(entries):
            return [S.chat_logprob_entry(raw, lp, top[:k])
                    for raw, lp, top in self.logprob_tokens(entries)]

        if not req.stream:
            texts = [[] for _ in range(req.n)]
            lps = [[] for _ in range(req.n)]
            finish = [None] * req.n

            async def collect():
                async for i, d in job:
                    texts[i].append(d.text)
                    if req.logprobs:
                        lps[i].extend(lp_entries(d.logprobs))
                    if d.finish_reason:
                        finish[i] = d.finish_reason

            await _unless_disconnected(request, job, collect())
            choices = [S.chat_choice(i, "".join(texts[i]), finish[i],
                                     lps[i] if req.logprobs else None)
                       for i in range(req.n)]
            return JSONResponse(S.chat_completion(
                rid, model, created, choices,
                S.usage(job.prompt_tokens, job.completion_tokens, job.cached_tokens)))

        usage_on = req.include_usage

        async def events():
            for i in range(req.n):
                yield S.chat_chunk(rid, model, created, i,
                                   {"role": "assistant", "content": ""},
                                   with_usage=usage_on)
            async for i, d in job:
                if d.text or d.logprobs:
                    yield S.chat_chunk(rid, model, created, i,
                                       {"content": d.text} if d.text else {},
                                       logprobs=lp_entries(d.logprobs) if req.logprobs else None,
                                       with_usage=usage_on)
                if d.finish_reason:
                    yield S.chat_chunk(rid, model, created, i, {}, finish=d.finish_reason,
                                       with_usage=usage_on)
            if usage_on:
                yield S.usage_chunk(rid, model, created, "chat.completion.chunk", S.usage(
                    job.prompt_tokens, job.completion_tokens, job.cached_tokens))

        return _sse(job, events())

    # completions ------------------------------------------------------------------------

    def completion_prompts(self, req: S.CompletionRequest) -> list[list[int]]:
        tok = self.engine.tokenizer
        p = req.prompt
        if isinstance(p, str):
            raw = [p]
        elif all(isinstance(x, int) for x in p):
            raw = [p]
        else:
            raw = p
        out = []
        for x in raw:
            if isinstance(x, str):
                out.append(tok.encode(x, add_special=True, parse_special=True))
            else:
                if not x:
                    raise invalid("prompt must not be empty", param="prompt")
                if any(not 0 <= t < tok.n_vocab for t in x):
                    raise invalid("prompt has a token id out of range", param="prompt")
                out.append(list(x))
        return out

    async def completions(self, request: Request) -> Response:
        req = S.CompletionRequest.model_validate(await self.json_body(request))
        self.check_model(req.model)
        self.check_n(req.n)
        prompts = self.completion_prompts(req)
        if len(prompts) * req.n > self.cfg.n_parallel:
            raise invalid(f"prompts × n must be at most {self.cfg.n_parallel}", param="n")
        want_lp = req.logprobs is not None
        k = req.logprobs or 0
        params = self.sampling(req, max(k, 1) if want_lp else 0, req.n)
        per_choice = [p for p in prompts for _ in range(req.n)]
        job = await self.service.submit(per_choice, params * len(prompts), req.limit,
                                        ignore_eos=req.ignore_eos, stops=req.stop)
        rid, created, model = S.new_id("cmpl"), S.now(), self.model_id()
        tok = self.engine.tokenizer
        echo = [tok.decode(p) if req.echo else "" for p in per_choice]
        if req.echo and isinstance(req.prompt, str):
            echo = [req.prompt] * len(per_choice)

        def lp_obj(entries, offset):
            tokens = [(raw, lp, top[:k]) for raw, lp, top in self.logprob_tokens(entries)]
            return S.completion_logprobs(tokens, offset)

        n = len(per_choice)
        if not req.stream:
            texts = [[e] for e in echo]
            lps = [[] for _ in range(n)]
            finish = [None] * n

            async def collect():
                async for i, d in job:
                    texts[i].append(d.text)
                    lps[i].extend(d.logprobs)
                    if d.finish_reason:
                        finish[i] = d.finish_reason

            await _unless_disconnected(request, job, collect())
            choices = [S.completion_choice(i, "".join(texts[i]), finish[i],
                                           lp_obj(lps[i], len(echo[i])) if want_lp else None)
                       for i in range(n)]
            return JSONResponse(S.completion(
                rid, model, created, choices,
                S.usage(job.prompt_tokens, job.completion_tokens, job.cached_tokens)))

        usage_on = req.include_usage

        async def events():
            offsets = [len(e) for e in echo]
            for i, e in enumerate(echo):
                if e:
                    yield S.completion_chunk(rid, model, created,
                                             S.completion_choice(i, e, None, None), usage_on)
            async for i, d in job:
                lp = lp_obj(d.logprobs, offsets[i]) if want_lp else None
                offsets[i] += len(d.text)
                yield S.completion_chunk(
                    rid, model, created,
                    S.completion_choice(i, d.text, d.finish_reason, lp), usage_on)
            if usage_on:
                yield S.usage_chunk(rid, model, created, "text_completion", S.usage(
                    job.prompt_tokens, job.completion_tokens, job.cached_tokens))

        return _sse(job, events())


def _frame(obj) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def _sse(job: Job, events) -> StreamingResponse:
    """Frame events as SSE; `data: [DONE]` last. The job is cancelled whenever the
    stream ends early (client disconnect cancels this generator)."""

    async def body():
        try:
            async for obj in events:
                yield _frame(obj)
            yield "data: [DONE]\n\n"
        except asyncio.CancelledError:
            raise
        except Exception as e:
            err = to_api_error(e)
            yield f"data: {json.dumps(err.body(), ensure_ascii=False)}\n\n"
        finally:
            job.close()

    return StreamingResponse(body(), media_type="text/event-stream", headers={
        "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _unless_disconnected(request: Request, job: Job, work) -> None:
    """Run `work`; if the client disconnects first, cancel it and the job."""

    async def disconnected():
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
            return
        task.cancel()
        raise APIError(499, "Client closed request")
    finally:
        watch.cancel()
        job.close()


def create_app(cfg: ServerConfig, *, engine_loader: Callable[[], Any] | None = None,
               make_request=None, make_decoder=None) -> Starlette:
    """Build the app. The engine loads in the background once the app starts
    (/health answers 503 until it is ready)."""
    metrics = Metrics()
    service = Service(engine_loader or (lambda: load_engine(cfg)),
                      n_parallel=cfg.n_parallel, max_queue=cfg.max_queue,
                      metrics=metrics, make_request=make_request,
                      make_decoder=make_decoder)
    api = _API(cfg, service, metrics)

    def route(path, fn, methods, name):
        async def endpoint(request: Request) -> Response:
            try:
                api.check_auth(request)
                response = await fn(request)
            except Exception as e:
                response = to_api_error(e).response()
            metrics.requests.labels(name, str(response.status_code)).inc()
            return response
        return Route(path, endpoint, methods=methods, name=f"{name}:{path}")

    routes = []
    for paths, fn, methods, name in [
        (("/health", "/v1/health"), api.health, ["GET"], "health"),
        (("/v1/models", "/models"), api.models, ["GET"], "models"),
        (("/metrics",), api.metrics_endpoint, ["GET"], "metrics"),
        (("/v1/chat/completions", "/chat/completions"), api.chat, ["POST"], "chat"),
        (("/v1/completions", "/completions"), api.completions, ["POST"], "completions"),
        (("/tokenize",), api.tokenize, ["POST"], "tokenize"),
        (("/detokenize",), api.detokenize, ["POST"], "detokenize"),
    ]:
        routes += [route(p, fn, methods, name) for p in paths]
    routes += chat_page.routes(api, route, page=cfg.webui)  # /props, and the chat page at /

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await service.start()
        try:
            yield
        finally:
            await service.close()

    middleware = []
    if cfg.cors_origins:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=cfg.cors_origins, allow_methods=["*"],
            allow_headers=["*"], allow_credentials="*" not in cfg.cors_origins))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers=exception_handlers)
    app.state.service = service
    app.state.metrics = metrics
    app.state.config = cfg
    return app
