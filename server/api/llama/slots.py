"""`GET /slots` (the slots and what each holds, in llama-server's shape; `--no-slots`
turns it off) and `POST /slots/{id}?action=save|restore|erase` (slot files in
`--slot-save-path`, server/engine/memory/slot_files.py). Each reads or changes the engine on its
thread between two steps (Service.on_engine); an action on a slot that is running
waits until it is idle, as llama-server defers it.
"""
from __future__ import annotations

import asyncio
import os
import time

from starlette.requests import Request
from starlette.responses import JSONResponse

from ggserve.server.api.errors import APIError, invalid
from ggserve.server.engine.memory import slot_files

_BUSY = object()
WAIT_S = 0.05


class SlotsAPI:
    def __init__(self, api, enabled: bool, save_path: str | None):
        self.api = api
        self.enabled = enabled
        self.save_path = save_path

    async def list(self, request: Request) -> JSONResponse:
        if not self.enabled:
            raise APIError(501, "This server does not support slots endpoint. Start it with `--slots`")
        self.api.engine                                        # 503 while loading
        slots = await self.api.service.on_engine(_listing)
        if request.query_params.get("fail_on_no_slot") and not any(not s["is_processing"] for s in slots):
            raise APIError(503, "no slot available")
        return JSONResponse(slots)

    async def action(self, request: Request) -> JSONResponse:
        if not self.save_path:
            raise APIError(501, "This server does not support slots action. Start it with `--slot-save-path`")
        engine = self.api.engine
        try:
            slot = int(request.path_params["id_slot"])
        except ValueError:
            raise invalid("Invalid slot ID") from None
        if not 0 <= slot < engine.n_parallel:
            raise invalid("Invalid slot ID")
        action = request.query_params.get("action")
        if action == "erase":
            n = await self._when_idle(slot, lambda e: e.erase_slot(slot))
            return JSONResponse({"id_slot": slot, "n_erased": n})
        if action not in ("save", "restore"):
            raise invalid("Invalid action")
        body = await self.api.json_body(request)
        filename = body.get("filename") if isinstance(body, dict) else None
        path = slot_files.path_in(self.save_path, filename)
        t0 = time.perf_counter()
        if action == "save":
            saved = await self._when_idle(slot, lambda e: e.save_slot(slot, path))
            if saved is None:
                raise invalid(f"slot {slot} holds no tokens to save")
            return JSONResponse({"id_slot": slot, "filename": filename, "n_saved": saved[0], "n_written": saved[1],
                                 "timings": {"save_ms": (time.perf_counter() - t0) * 1000}})
        n, n_file = await self._when_idle(slot, lambda e: e.restore_slot(slot, path))
        if n != n_file:
            raise APIError(503, f"no room in the KV cache for {n_file} tokens")
        return JSONResponse({"id_slot": slot, "filename": filename, "n_restored": n, "n_read": os.path.getsize(path),
                             "timings": {"restore_ms": (time.perf_counter() - t0) * 1000}})

    async def _when_idle(self, slot: int, fn):
        """fn(engine) on the engine thread once the slot is idle (llama-server defers it too)."""
        while True:
            out = await self.api.service.on_engine(lambda e: _BUSY if e.slot_running(slot) else fn(e))
            if out is not _BUSY:
                return out
            await asyncio.sleep(WAIT_S)


def _listing(engine) -> list:
    """Each slot as llama-server's /slots shows it (the fields this server has)."""
    out = []
    for slot in range(engine.n_parallel):
        seq = engine.slots.running.get(slot) or engine.slots.last.get(slot)
        info = {"id": slot, "n_ctx": engine.n_ctx, "speculative": False,
                "is_processing": slot in engine.slots.running}
        if seq is not None:
            busy = slot in engine.slots.running       # an idle slot shows no budget (llama-server)
            info.update({
                "id_task": seq.id,
                "n_prompt_tokens": len(engine.slots.slot_tokens(slot)),
                "n_prompt_tokens_processed": max(0, min(seq.n_computed, seq.n_prompt) - seq.n_cached),
                "n_prompt_tokens_cache": seq.n_cached,
                "next_token": [{"has_next_token": busy, "has_new_line": False,
                                "n_remain": max(0, seq.request.max_tokens - seq.n_generated) if busy else -1,
                                "n_decoded": seq.n_generated if busy else 0}],
            })
        out.append(info)
    return out
