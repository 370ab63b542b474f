"""Errors a request can cause below the HTTP layer, each with the API error it
maps to (server/errors.py maps them by type)."""
from __future__ import annotations


class RequestError(ValueError):
    """A request that cannot be served as sent: a 400 with this code and param."""

    code = "invalid_request_error"
    param: str | None = None


class ContextLengthExceeded(RequestError):
    code = "context_length_exceeded"
    param = "messages"


class ImagesNotSupported(RequestError):
    code = "images_not_supported"
    param = "messages"


class SequenceFailed(RuntimeError):
    """The engine ended one request (an image that failed to encode, non-finite
    logits); every other request goes on. A 500."""
