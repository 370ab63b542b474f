"""Why the service cannot take or finish a request, as types: the API layer maps
each to its status and error shape (server/api/errors.py)."""
from __future__ import annotations


class ServiceError(Exception):
    """A request the service refuses or ends; `code` and `retry_after` (seconds)
    go to the client as they are."""

    def __init__(self, message: str, *, code: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


class QueueFull(ServiceError):
    """More requests queued than --parallel plus the queue allow."""


class Unavailable(ServiceError):
    """The model is loading, the server is shutting down, or an RPC worker was lost."""


class EngineFailed(ServiceError):
    """The engine raised, or ended one request with an error."""
