"""OpenAI's error shape and the exception handlers that produce it.

Every error leaves the server as
`{"error": {"message": str, "type": str, "param": str | None, "code": str | int | None}}`
with the matching HTTP status, whatever raised it.
"""
from __future__ import annotations

import json
import logging

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from ggserve.models.chat_template import TemplateError
from ggserve.server.request_errors import RequestError
from ggserve.server.service.errors import EngineFailed, QueueFull, ServiceError, Unavailable

log = logging.getLogger("ggserve.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class APIError(Exception):
    """An error with an HTTP status, shown to the client in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 param: str | None = None, code: str | int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "server_error")
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", param="model",
                    code="model_not_found")


def from_validation_error(exc: ValidationError) -> APIError:
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err.get("loc", ()) if not str(p).startswith("function-")]
    # pydantic puts the union member's tag into loc (`str`, `list[...]`); keep field names
    param = ".".join(p for p in loc if not any(c in p for c in "[]") and p not in
                     ("str", "int", "float", "bool", "list", "dict", "none")) or None
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return invalid(f"{param}: {msg}" if param else msg, param=param)


# the service's refusals, by type (a subclass takes its first match)
_SERVICE_STATUS = ((QueueFull, 429), (Unavailable, 503), (EngineFailed, 500), (ServiceError, 500))


def from_service_error(exc: ServiceError) -> APIError:
    status = next(s for t, s in _SERVICE_STATUS if isinstance(exc, t))
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return APIError(status, str(exc), code=exc.code, headers=headers)


def to_api_error(exc: BaseException) -> APIError:
    """Map any exception raised while serving a request to an APIError."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValidationError):
        return from_validation_error(exc)
    if isinstance(exc, json.JSONDecodeError):
        return invalid(f"Invalid JSON in request body: {exc.msg}")
    if isinstance(exc, HTTPException):
        return APIError(exc.status_code, exc.detail or "error",
                        headers=dict(exc.headers or {}))
    name = type(exc).__name__
    if isinstance(exc, ServiceError):
        return from_service_error(exc)
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, TemplateError):
        return invalid(f"Chat template error: {exc}", param="messages")
    if isinstance(exc, ValueError):
        return invalid(str(exc))
    log.exception("internal error", exc_info=exc)
    return APIError(500, f"Internal server error: {name}: {exc}")


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    return to_api_error(exc).response()


exception_handlers = {
    Exception: _handle,
    HTTPException: _handle,
    APIError: _handle,
}
