"""A job's prompts -> the engine's requests (one per choice), with what each may generate."""
from __future__ import annotations

from typing import Any, Callable


def engine_requests(make_request: Callable[..., Any], prompts: list, choices: list, params: list, *,
                    max_tokens: int | None, n_ctx: int, context_shift: bool, ignore_eos: bool,
                    id_slot: int = -1, **flags) -> list:
    """flags (embed, progress, n_keep, cache_salt, adapters) go to every request where set;
    id_slot to the first only (llama-server's children take any slot)."""
    requests = []
    for p, c, prm in zip(prompts, choices, params):
        # (with context shift a generation goes past the context: llama-server's n_predict -1 is endless)
        room = 2**31 - 1 if context_shift else max(0, n_ctx - len(p.tokens))
        limit = room if max_tokens is None or max_tokens < 0 else min(max_tokens, room)
        extra = {"images": list(p.images)} if p.images else {}
        if p.turn_starts:
            extra["turn_starts"] = tuple(p.turn_starts)
        if p.positions is not None:
            extra["positions"] = p.positions
        extra.update({k: v for k, v in flags.items() if v})
        if id_slot >= 0 and not requests:
            extra["id_slot"] = id_slot
        requests.append(make_request(id=c.request_id, prompt=list(p.tokens), params=prm,
                                     max_tokens=limit, ignore_eos=ignore_eos, **extra))
    return requests
