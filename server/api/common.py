"""What every endpoint shares (the service, config, auth, request bodies, sampling
parameters) and the small endpoints: /health, /v1/models, /metrics, /tokenize,
/detokenize."""
from __future__ import annotations

import copy
import json
import math
import os
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.models.tokenizer.pretokenize import drop
from ggserve.server.api import schemas as S
from ggserve.server.api.errors import APIError, invalid
from ggserve.server.api.limits import json_object, key_matches
from ggserve.server.api.owners import cache_salt, owner, presented_key
from ggserve.server.api.request_limits import RequestLimits, check_request
from ggserve.server.service.metrics import Metrics
from ggserve.server.service.service import Service

# Reachable without the API key, as in llama-server.
_PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}
DEFAULT_MAX_BODY = 64 * 2**20    # --max-body-mb
# Route names (server/app.py) that clients poll. They answer without the model, so they never
# wake a sleeping server (server/service/sleep.py), and ggserve_requests_total leaves them out.
_POLLS = {"health", "models", "metrics", "openapi"}


def is_poll(name: str, method: str) -> bool:
    return name in _POLLS or (name == "props" and method == "GET")


class API:
    def __init__(self, cfg, service: Service, metrics: Metrics):
        self.cfg = cfg
        self.service = service
        self.metrics = metrics
        self.media = cfg.media
        self.sleeper = None           # server/service/sleep.py Sleeper, with --sleep-idle-seconds

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
        if self.aliases():
            return self.aliases()[0]      # llama-server: the first of its sorted set of -a aliases
        if self.service.model_name:
            return self.service.model_name
        return os.path.splitext(os.path.basename(self.cfg.model))[0]

    def aliases(self) -> list[str]:
        return sorted({a.strip() for a in (self.cfg.alias or "").split(",") if a.strip()})

    def settle_fields(self, req: S._Sampling) -> None:
        """A request's fields as this server takes them. Any `model` is accepted, as
        llama-server does (one model is served; SDKs and tools ship names such as
        gpt-4o-mini). llama.cpp fields this server does not do are refused by name
        rather than ignored. A request that leaves ignore_eos out takes --ignore-eos."""
        bad = req.unsupported()
        if bad:
            raise invalid(f"{bad} is not supported by this server", param=bad)
        if not -1 <= req.id_slot < self.cfg.n_parallel:     # (llama-server would wait forever)
            raise invalid(f"id_slot must be -1 (any) or a slot below {self.cfg.n_parallel}", param="id_slot")
        if "ignore_eos" not in req.model_fields_set:        # --ignore-eos: the default of requests
            req.ignore_eos = bool(getattr(self.cfg, "ignore_eos", False))

    def n_keep(self, req) -> int:
        """llama-server's n_keep (what a context shift keeps of the prompt): the request's, else --keep."""
        return req.n_keep if "n_keep" in req.model_fields_set else getattr(self.cfg, "n_keep", 0)

    @property
    def grammars(self):
        """Grammar compiler for the model's vocabulary."""
        self.engine                     # 503 while loading
        return self.service.grammars

    def check_auth(self, request: Request) -> None:
        if not self.cfg.api_keys or request.url.path in _PUBLIC:
            return
        key = presented_key(request.headers)
        if not key:
            raise APIError(401, "Missing API key: send `Authorization: Bearer <key>` or "
                                "`x-api-key: <key>`", code="invalid_api_key")
        if not key_matches(key, self.cfg.api_keys):
            raise APIError(401, "Invalid API key", code="invalid_api_key")

    def owner(self, request: Request) -> str:
        """Whose the request is (server/api/owners.py): its API key's digest, "" without keys."""
        return owner(request.headers, self.cfg.api_keys)

    def cache_salt(self, request: Request, req: S._Sampling) -> str:
        """The engine's cache salt of a generation: its cache_salt, and its API key with
        --cache-isolation key (server/api/owners.py)."""
        by_key = getattr(self.cfg, "cache_isolation", "none") == "key"
        return cache_salt(self.owner(request) if by_key else "", req.cache_salt)

    @property
    def limits(self) -> RequestLimits:
        return getattr(self.cfg, "limits", None) or RequestLimits()

    async def json_body(self, request: Request) -> dict:
        """The body as a JSON object (server/api/limits.py: size, nesting, Unicode), within
        what a request may ask for (server/api/request_limits.py)."""
        body = await json_object(request, getattr(self.cfg, "max_body_bytes", DEFAULT_MAX_BODY))
        check_request(body, self.limits, self.cfg.n_parallel)
        return body

    def sampling(self, req: S._Sampling, n_probs: int, n: int) -> list:
        """One SamplingParams per choice (an explicit seed differs per choice)."""
        from ggserve.server.engine.sampling.sampler import SamplingParams

        kw = {k: getattr(req, k) for k in (
            "temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
            "repeat_last_n", "presence_penalty", "frequency_penalty", "seed")
            if getattr(req, k) is not None}
        kw = {**getattr(self.cfg, "sampling_defaults", {}), **kw}      # --temp, --top-k, ..., --seed
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
        if getattr(req, "ignore_eos", False):
            # llama-server bans every end-of-generation token (-inf logit_bias, after the request's)
            kw["logit_bias"] = {**kw.get("logit_bias", {}),
                                **{t: -math.inf for t in sorted(self.engine.tokenizer.eog_ids)}}
        kw["n_probs"] = n_probs
        kw["post_probs"] = bool(getattr(req, "post_sampling_probs", False))
        try:
            params = SamplingParams(**kw)       # checks its fields
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
        tok = self.service.engine.tokenizer
        # as llama-server shows them: an alternative's control token, and the end-of-generation
        # token that ended the answer, have empty text
        return [(tok.token_bytes(t, special=not tok.is_eog(t)), lp,
                 [(tok.token_bytes(u, special=False), v) for u, v in top]) for t, lp, top in entries]

    # -- endpoints --------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if self.service.lost is not None:
            raise APIError(503, self.service.lost, code="worker_lost")
        if self.service.ready or (self.sleeper is not None and self.sleeper.sleeping):
            return JSONResponse({"status": "ok"})
        if self.service.load_error is not None:
            raise APIError(500, f"Model failed to load: {self.service.load_error}")
        raise APIError(503, "Loading model", code="model_loading",
                       headers={"Retry-After": "5"})

    async def models(self, request: Request) -> Response:
        meta = {"n_ctx": self.cfg.n_ctx, "n_parallel": self.cfg.n_parallel}
        if self.service.ready:      # n_ctx: a request's limit (a slot's context), as llama-server
            e = self.service.engine
            meta.update(n_ctx=e.n_ctx, n_ctx_slot=e.n_ctx, n_ctx_train=e.n_ctx_train, kv_size=e.kv_size,
                        n_vocab=e.tokenizer.n_vocab)
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_id(), "aliases": self.aliases(), "tags": sorted(getattr(self.cfg, "tags", ())),
            "object": "model", "created": S.now(), "owned_by": "ggserve", "meta": meta,
        }]})

    async def metrics_endpoint(self, request: Request) -> Response:
        if not self.cfg.metrics:
            raise APIError(501, "This server does not support metrics endpoint; "
                                "start it with --metrics")
        response = Response(self.metrics.render(), media_type=self.metrics.content_type)
        # as llama-server, with its capitals (starlette's headers= would lower them; clients that
        # read headers into a plain dict look for this spelling)
        response.raw_headers.append((b"Process-Start-Time-Unix", str(self.metrics.t_start).encode()))
        return response

    async def tokenize(self, request: Request) -> Response:
        req = S.TokenizeRequest.model_validate(await self.json_body(request))
        # a long text takes seconds and its answer is megabytes: both on the prompt thread
        body = await self.service.on_prompt_thread(_tokenize, self.engine.tokenizer, req)
        return Response(body, media_type="application/json")

    async def detokenize(self, request: Request) -> Response:
        req = S.DetokenizeRequest.model_validate(await self.json_body(request))
        tok = self.engine.tokenizer
        bad = [t for t in req.tokens if not 0 <= t < tok.n_vocab]
        if bad:
            raise invalid(f"token id {bad[0]} is out of range", param="tokens")
        return JSONResponse({"content": tok.decode(req.tokens)})


def _tokenize(tok, req: S.TokenizeRequest) -> bytes:
    """/tokenize's answer, as JSONResponse would render it."""
    ids = tok.encode(req.content, add_special=req.add_special, parse_special=req.parse_special)
    tokens: list[Any] = ids
    if req.with_pieces:
        tokens = []
        for i in ids:
            raw = tok.token_bytes(i)
            try:
                piece: Any = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            tokens.append({"id": i, "piece": piece})
    # in slices: one json.dumps of millions of ids holds the GIL (the event loop) for 0.6 s
    parts = [json.dumps(tokens[i:i + 65536], ensure_ascii=False, separators=(",", ":"))[1:-1]
             for i in range(0, len(tokens), 65536)]
    body = ('{"tokens":[' + ",".join(parts) + "]}").encode("utf-8")
    drop(tokens)                # millions of ints: freed here, not on the event loop
    drop(ids)
    return body
