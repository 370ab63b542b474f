"""llama-server's LoRA adapters over HTTP (server/engine/adapters.py holds them):
`GET /lora-adapters` lists them (id, path, scale, task_name, prompt_prefix), `POST
/lora-adapters` sets the server-wide scales ([{id, scale}]; an adapter left out goes to
0), and every generation route takes a request's `lora` field, the same list, for that
request only (an adapter left out: 0; absent or []: the server-wide scales).

Beyond llama-server, which ignores them: an unknown id, or a scale that is not a number,
is a 400 naming the field.
"""
from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import JSONResponse

from ggserve.server.api.common import DEFAULT_MAX_BODY
from ggserve.server.api.errors import invalid
from ggserve.server.api.limits import parse_json, read_body


def routes(api, route) -> list:
    async def listing(request: Request) -> JSONResponse:
        adapters = api.engine.loaded.adapters
        return JSONResponse([{"id": i, "path": a.path, "scale": adapters.scales[i], "task_name": a.task_name,
                              "prompt_prefix": a.prompt_prefix} for i, a in enumerate(adapters.loras)])

    async def set_scales(request: Request) -> JSONResponse:
        body = parse_json(await read_body(request, getattr(api.cfg, "max_body_bytes", DEFAULT_MAX_BODY)))
        if not isinstance(body, list):
            raise invalid("Request body must be an array")
        scales = _scales(body, len(api.engine.loaded.adapters.loras), "body")

        def apply(engine):
            engine.loaded.adapters.scales = scales      # between steps, on the engine's thread

        await api.service.on_engine(apply)
        return JSONResponse({"success": True})

    return [route("/lora-adapters", listing, ["GET"], "lora_adapters"),
            route("/lora-adapters", set_scales, ["POST"], "lora_adapters_set")]


def request_adapters(api, req) -> tuple:
    """A generation request's adapters for the engine: (id, scale) pairs with non-zero
    scales, by id (llama.cpp leaves an adapter of scale 0 out of the graph)."""
    adapters = api.engine.loaded.adapters
    raw = getattr(req, "lora", None)
    scales = _scales(raw, len(adapters.loras), "lora") if raw else list(adapters.scales)
    return tuple((i, s) for i, s in enumerate(scales) if s != 0.0)


def _scales(entries, n: int, field: str) -> list[float]:
    """[{id, scale}, ...] -> a scale per adapter (0 for those not listed)."""
    if not isinstance(entries, list):
        raise invalid(f"'{field}' must be an array of objects with 'id' and 'scale' fields", param=field)
    scales = [0.0] * n
    for e in entries:
        i = e.get("id") if isinstance(e, dict) else None
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise invalid(f"'{field}': id {i!r} is not a loaded adapter (ids 0..{n - 1})"
                          if n else f"'{field}': no LoRA adapter is loaded (start with --lora)", param=field)
        s = e.get("scale", 0.0)
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            raise invalid(f"'{field}': the scale of adapter {i} must be a finite number", param=field)
        scales[i] = float(s)
    return scales
