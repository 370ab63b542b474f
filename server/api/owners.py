"""Who a request belongs to: the API key it came in with, and the prompt cache's salt.

With API keys configured (--api-key, --api-key-file), what a request leaves behind
answers only to the same key: stored responses (/v1/responses, GET and DELETE by id,
previous_response_id) and resumable streams (server/api/stream_resume.py). Another
key is told they do not exist (404), as an unknown id is. An owner is a digest of the
key, so no key is kept beside what it owns; without keys every request has the same
owner, "", as before.

The prompt cache (server/engine/memory/prefix_cache.py, host_cache.py, slot files)
shares a prefix only among requests of one `cache_salt` (the engine's
Request.cache_salt): a request's own `cache_salt` field (vLLM's), and with
`--cache-isolation key` its owner, folded into one digest. A request with neither
has salt "" and shares with every other such request, as llama-server's cache does.
"""
from __future__ import annotations

import hashlib


def presented_key(headers) -> str:
    """The key a request presents: `Authorization: Bearer KEY` or `x-api-key: KEY` ("" for none)."""
    auth = headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")


def owner(headers, api_keys) -> str:
    """Whose a request is: a digest of its API key, or "" when the server has no keys.
    (Call it for a request that passed check_auth: its key is one of api_keys.)"""
    if not api_keys:
        return ""
    key = presented_key(headers)
    return _digest("key", key) if key else ""


def cache_salt(owner: str, salt: str | None) -> str:
    """The engine's cache salt for an owner ("" unless the cache is isolated by key) and a
    request's cache_salt field: "" when both are empty (the shared cache)."""
    if not owner and salt is None:
        return ""
    return _digest("salt", owner, salt or "")


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        data = p.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little") + data)       # lengths: no two part lists meet
    return h.hexdigest()
