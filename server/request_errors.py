"""Errors a request can cause below the HTTP layer, each with the API error it
maps to (server/api/errors.py maps them by type)."""
from __future__ import annotations


class RequestError(ValueError):
    """A request that cannot be served as sent: a 400 with this code and param."""

    code: str | None = "invalid_request_error"
    param: str | None = None

    def __init__(self, message: str = "", *, param: str | None = None):
        super().__init__(message)
        if param is not None:
            self.param = param


class InvalidOption(RequestError):
    """A field the chat layer cannot apply (tools, tool_choice, response_format, grammar)."""

    code = None


class ContextLengthExceeded(RequestError):
    code = "context_length_exceeded"
    param = "messages"


class ImagesNotSupported(RequestError):
    code = "images_not_supported"
    param = "messages"


class AudioNotSupported(RequestError):
    code = "audio_not_supported"
    param = "messages"


class SequenceFailed(RuntimeError):
    """The engine ended one request (an image that failed to encode, non-finite
    logits); every other request goes on. A 500."""
