"""`/tools`: the tools the server runs for the chat page (server/agent_tools/), in llama-server's shapes.

GET /tools lists them; POST /tools `{"tool", "params", "stream"}` runs one: its result as JSON
(a tool's failure is `{"error": ...}` with status 200), or with `stream: true` (exec_shell_command)
SSE events `{"chunk": ...}` then `{"done": true}`. Headers, not the model, say where a call runs:
`x-tool-cwd`, `x-tool-runtime`, `x-resp-type`. Without --tools or MCP servers both answer 403.
Like every route, they are behind the API key.
"""
from __future__ import annotations

import asyncio
import json
from typing import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ggserve.server.agent_tools.errors import ToolRequestError
from ggserve.server.agent_tools.toolbox import CallPlace, ToolBox
from ggserve.server.api.errors import APIError, invalid

DRAIN_POLL_SECONDS = 0.05


def disabled() -> APIError:
    return APIError(403, "this feature is disabled", type="feature_disabled")


def routes(api, route: Callable, toolbox: ToolBox | None) -> list[Route]:
    async def list_tools(request: Request) -> Response:
        if toolbox is None:
            raise disabled()
        return JSONResponse(toolbox.listing())

    async def call_tool(request: Request) -> Response:
        if toolbox is None:
            raise disabled()
        body = await api.json_body(request)
        name, params, stream = body.get("tool"), body.get("params", {}), body.get("stream", False)
        if not isinstance(name, str) or not isinstance(params, dict) or not isinstance(stream, bool):
            raise invalid('POST /tools takes {"tool": name, "params": {...}, "stream": bool}')
        place = CallPlace(request.headers.get("x-tool-cwd") or None, request.headers.get("x-tool-runtime") or None,
                          request.headers.get("x-resp-type") or None)
        try:
            toolbox.check(name, stream)
            if stream:
                return StreamingResponse(_stream(api, toolbox, name, params, place), media_type="text/event-stream")
            return JSONResponse(await _unless_draining(api, toolbox.invoke(name, params, place)))
        except ToolRequestError as e:
            raise APIError(e.status, str(e)) from None

    return [route("/tools", list_tools, ["GET"], "tools"), route("/tools", call_tool, ["POST"], "tools_call")]


async def _unless_draining(api, call) -> dict:
    """The call's result; cancelled when the server starts shutting down (a slow MCP server must
    not hold the shutdown up)."""
    task = asyncio.ensure_future(call)
    while not task.done():
        await asyncio.wait({task}, timeout=DRAIN_POLL_SECONDS)
        if not task.done() and api.service.draining:
            task.cancel()
            return {"error": "cancelled: the server is shutting down"}
    return task.result()


async def _stream(api, toolbox: ToolBox, name: str, params: dict, place: CallPlace):
    chunks: asyncio.Queue = asyncio.Queue()

    def push(text: str) -> bool:
        chunks.put_nowait(text)
        return True

    task = asyncio.ensure_future(_unless_draining(api, toolbox.invoke(name, params, place, push)))
    try:
        while not (task.done() and chunks.empty()):
            getter = asyncio.ensure_future(chunks.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield f"data: {json.dumps({'chunk': getter.result()})}\n\n"
            else:
                getter.cancel()
        done = {"done": True}
        try:
            result = task.result()
        except ToolRequestError as e:
            result = {"error": str(e)}
        if result and result.get("error"):
            done["error"] = result["error"]
        yield f"data: {json.dumps(done)}\n\n"
    finally:
        task.cancel()               # the client left: the command is killed with its process group
