"""Vertex AI custom-container compatibility, on when AIP_MODE=PREDICTION (as llama-server 11434,
tools/server/server-http.cpp register_gcp_compat).

POST AIP_PREDICT_ROUTE (default /predict) takes `{"instances": [...]}`, at most 128; each
instance names the endpoint it is for in `@requestFormat`, as a path (`/v1/chat/completions`)
or its camelCase alias (`chatCompletions`), and is answered, without streaming, by that
endpoint. The answers, errors included (in the endpoint's own error shape), come back in
order as `{"predictions": [...]}`. AIP_HEALTH_ROUTE, when set, answers as /health;
AIP_HTTP_PORT (default 8080) is the port served, whatever --port says.

ref: https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements
"""
from __future__ import annotations

import asyncio
import json
import os

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.server.api.errors import APIError
from ggserve.server.api.limits import parse_json, read_body

MAX_INSTANCES = 128


def enabled() -> bool:
    return os.environ.get("AIP_MODE") == "PREDICTION"


def port(default: int) -> int:
    return int(os.environ.get("AIP_HTTP_PORT") or 8080) if enabled() else default


def _route_env(name: str, default: str) -> str:
    v = os.environ.get(name) or default
    return v if not v or v.startswith("/") else "/" + v


def request_format(path: str) -> str:
    """llama-server's alias for a path: /v1/chat/completions -> chatCompletions, /apply-template
    -> applyTemplate (a leading /v1 dropped, path parameters left out)."""
    if path.startswith("/v1"):
        path = path[3:]
    out, cap = [], False
    for c in path.lstrip("/"):
        if c in ":{":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def routes(existing: list, route, health) -> list:
    """The predict route over the POST endpoints among `existing` (starlette Routes), and the
    health route when AIP_HEALTH_ROUTE is set."""
    if not enabled():
        return []
    handlers = {r.path: r.endpoint for r in existing if "POST" in (r.methods or ()) and "{" not in r.path}
    predict_path = _route_env("AIP_PREDICT_ROUTE", "/predict")
    if predict_path in handlers:
        raise SystemExit(f"ggserve serve: AIP_PREDICT_ROUTE={predict_path} conflicts with a ggserve route")
    out = [route(predict_path, _predict_endpoint(handlers, route.api), ["POST"], "predict")]
    health_path = _route_env("AIP_HEALTH_ROUTE", "")
    if health_path:
        out.append(route(health_path, health, ["GET"], "health"))
    return out


def _predict_endpoint(handlers: dict, api):
    """POST /predict over these handlers (by path): each instance answered by its own."""
    aliases: dict[str, str] = {}
    for path in handlers:
        aliases.setdefault(request_format(path), path)       # the first one wins, as llama-server

    async def predict(request: Request) -> Response:
        instances = _instances(parse_json(await read_body(request, api.cfg.max_body_bytes)))
        if isinstance(instances, Response):
            return instances
        predictions = await asyncio.gather(*(_prediction(request, i, handlers, aliases) for i in instances))
        return JSONResponse({"predictions": list(predictions)})

    return predict


def _instances(data) -> list | Response:
    """The body's `instances` (the body checked as every route's: size, nesting, UTF-8), or
    the 400 that says what is wrong with it."""
    if not isinstance(data, dict):
        return APIError(400, "request body must be a JSON object").response()
    instances = data.get("instances")
    if not isinstance(instances, list):
        return APIError(400, "request body must include an array field named instances").response()
    if len(instances) > MAX_INSTANCES:
        return APIError(400, f"instances array exceeds maximum size of {MAX_INSTANCES}").response()
    return instances


async def _prediction(request: Request, instance, handlers: dict, aliases: dict[str, str]) -> object:
    """One instance's answer from the endpoint its @requestFormat names (its error body, if any)."""
    if not isinstance(instance, dict):
        return APIError(400, "each instance must be a JSON object").body()
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return APIError(400, "each instance must include a string @requestFormat").body()
    path = aliases.get(fmt, fmt if fmt in handlers else None)
    if path is None:
        return APIError(400, f"no handler registered for @requestFormat: {fmt}").body()
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False           # streaming is not part of the predict protocol
    response: Response = await handlers[path](_forwarded(request, path, json.dumps(payload).encode()))
    return _answer_body(response)


def _forwarded(request: Request, path: str, body: bytes) -> Request:
    """The predict request, as a request for `path` carrying `body`."""
    sent = False

    async def receive():
        nonlocal sent
        if sent:                  # then, the predict request's own: a disconnect when its client goes
            return await request.receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {**request.scope, "path": path, "raw_path": path.encode(), "query_string": b""}
    return Request(scope, receive)


def _answer_body(response: Response) -> object:
    """An endpoint's answer as a prediction: its JSON, else its text, else None."""
    data = getattr(response, "body", None)           # (a streamed answer has none)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")
