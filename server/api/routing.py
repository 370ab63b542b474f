"""What every endpoint goes through: the drain check, the API key, waking a
sleeping model, errors in the API's own shape, and the request counter."""
from __future__ import annotations

from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ggserve.server.api.common import API, is_poll
from ggserve.server.api.errors import APIError, to_api_error

Endpoint = Callable[[Request], Awaitable[Response]]


class Router:
    """route(path, endpoint, methods, name): a Starlette Route that wraps the endpoint.
    errors: APIError -> Response, for APIs with their own error shape (Anthropic's)."""

    def __init__(self, api: API):
        self.api = api

    def __call__(self, path: str, fn: Endpoint, methods: list[str], name: str,
                 errors: Callable[[APIError], Response] | None = None) -> Route:
        async def endpoint(request: Request) -> Response:
            poll = is_poll(name, request.method)
            try:
                response = await self._serve(fn, request, poll)
            except Exception as e:
                err = to_api_error(e)
                response = errors(err) if errors else err.response()
            if not poll:
                self.api.metrics.requests.labels(name, str(response.status_code)).inc()
            return response
        return Route(path, endpoint, methods=methods, name=f"{name}:{path}")

    async def _serve(self, fn: Endpoint, request: Request, poll: bool) -> Response:
        if self.api.service.draining:
            raise APIError(503, "Server is shutting down", code="shutting_down", headers={"Retry-After": "5"})
        self.api.check_auth(request)
        sleeper = self.api.sleeper
        if sleeper is None or poll:                 # a health poll neither wakes the model nor keeps it up
            return await fn(request)
        await sleeper.enter()
        try:
            return await fn(request)
        finally:
            sleeper.leave()
