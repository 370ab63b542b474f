"""The router's models and their states: which are loaded, which load next, which give way.

Rules (llama-server 11434's, tools/server/tests/unit/test_router.py):
- at most `models_max` models are loading or loaded; a model that must load when all are
  taken evicts the least recently used loaded model that nobody is using or waiting for;
- a model serving a request is never evicted: a request that finds every model busy waits
  in a queue, served first come first served;
- requests for one model share one queue entry and one load;
- a request that leaves while queued takes its entry with it, if it was the last one waiting;
- a load that fails fails the requests waiting for it, with the child's reason, and the
  model shows `failed` until the next request or /models/load tries again;
- a model idle past its keep-alive (Ollama's keep_alive) is unloaded.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from dataclasses import dataclass, field

from ggserve.server.router.catalog import ModelSpec
from ggserve.server.router.child import Child, LoadFailed

log = logging.getLogger("ggserve.router")

# llama-server's LLAMA_SERVER_DEBUG_FAKE_TIMING: a load and a request each wait 2 s first, so
# tests can see the queue (llama.cpp's test_router.py sets it for both servers)
FAKE_DELAY = 2.0 if os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING") else 0.0
REAP_SECONDS = 0.25


@dataclass
class Model:
    spec: ModelSpec
    status: str = "unloaded"                 # unloaded | loading | loaded | failed
    failure: str | None = None               # why the last load or run failed
    exit_code: int | None = None
    child: Child | None = None
    active: int = 0                          # requests it is serving now
    pending: int = 0                         # requests waiting for it to load
    last_used: float = 0.0
    loaded_at: float = 0.0                   # time.time() when it became ready
    load_seconds: float = 0.0
    expires_at: float | None = None          # monotonic time its keep-alive ends; None: never
    ready: asyncio.Future | None = None      # done when the current load ends
    stopping: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")


@dataclass
class _Entry:
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0
    keep: bool = False                        # asked by /models/load: stays without waiters


class Registry:
    def __init__(self, specs: list[ModelSpec], child_args: list[str], models_max: int):
        self.child_args = child_args          # the command line's flags: they win over a preset's
        self.models_max = models_max
        self.models: dict[str, Model] = {}
        self.queue: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self.replace_specs(specs)

    def replace_specs(self, specs: list[ModelSpec]) -> None:
        """A new list of models (start, ?reload=1): running models stay until unloaded."""
        new = {s.id: s for s in specs}
        for mid in list(self.models):
            if mid not in new and not self.models[mid].running:
                del self.models[mid]
        for mid, spec in new.items():
            if mid in self.models:
                self.models[mid].spec = spec
            else:
                self.models[mid] = Model(spec)

    def get(self, name: str) -> Model | None:
        return self.models.get(name)

    # -- using a model -----------------------------------------------------------------

    async def acquire(self, model: Model) -> Model:
        """Wait until the model serves (loading it, queued if need be) and count a request on it."""
        model.pending += 1
        try:
            while True:
                if model.status == "loaded":
                    model.active += 1
                    model.last_used = time.monotonic()
                    return model
                if model.status == "loading":
                    await asyncio.shield(model.ready)
                    if model.status == "failed":
                        raise LoadFailed(model.failure or "the model failed to load")
                    continue
                await self._queued(model.spec.id)
        finally:
            model.pending -= 1

    async def _queued(self, mid: str) -> None:
        entry = self.queue.setdefault(mid, _Entry())
        entry.waiters += 1
        self._admit()
        try:
            await entry.admitted.wait()
        finally:
            entry.waiters -= 1
            if not entry.admitted.is_set() and entry.waiters == 0 and not entry.keep:
                self.queue.pop(mid, None)      # the last one waiting left: the entry goes too
                self._admit()

    def release(self, model: Model) -> None:
        model.active -= 1
        model.last_used = time.monotonic()
        self._admit()

    def keep_alive(self, model: Model, seconds: float | None) -> None:
        """Unload the model once idle for `seconds` (None: never; 0: as soon as it is idle)."""
        model.expires_at = None if seconds is None or seconds < 0 else time.monotonic() + seconds

    def request_load(self, mid: str) -> None:
        """/models/load, load-on-startup: load when a slot frees, nobody waiting needed."""
        self.queue.setdefault(mid, _Entry()).keep = True
        self._admit()

    async def unload(self, model: Model) -> None:
        entry = self.queue.pop(model.spec.id, None)
        if entry is not None:
            entry.admitted.set()
        if model.status == "loading":
            await asyncio.shield(model.ready)
        if model.running:
            self._stop(model)
        if model.stopping is not None:
            await asyncio.shield(model.stopping)

    # -- slots ---------------------------------------------------------------------------

    def _admit(self) -> None:
        """Start what the queue's head asks for while a slot is free or can be freed (FIFO)."""
        while self.queue:
            mid, entry = next(iter(self.queue.items()))
            model = self.models.get(mid)
            victim = None
            if model is not None and not model.running:
                if sum(m.running for m in self.models.values()) >= self.models_max:
                    victim = self._victim()
                    if victim is None:
                        return                 # every model busy: the head waits, and all behind it
                    self._stop(victim)
                # loading from now on: the requests admitted wait for this load, not another
                model.status, model.failure, model.exit_code = "loading", None, None
                model.ready = asyncio.get_running_loop().create_future()
                self._spawn(self._load(model, victim.stopping if victim else None))
            self.queue.popitem(last=False)
            entry.admitted.set()

    def _victim(self) -> Model | None:
        idle = [m for m in self.models.values() if m.status == "loaded" and m.active == 0 and m.pending == 0]
        return min(idle, key=lambda m: m.last_used) if idle else None

    def _stop(self, model: Model) -> None:
        log.info("model %s: unloading", model.spec.id)
        model.status, model.expires_at = "unloaded", None
        child, model.child = model.child, None
        if child is not None:
            model.stopping = self._spawn(child.stop(model.spec.stop_timeout))

    async def _load(self, model: Model, after: asyncio.Task | None) -> None:
        t0, child = time.monotonic(), None
        try:
            if after is not None:
                await asyncio.shield(after)      # the evicted model's memory first
            if FAKE_DELAY:
                await asyncio.sleep(FAKE_DELAY)
            child = Child(model.spec.id, model.spec.args + self.child_args)
            model.child = child
            await child.start()
            model.status, model.loaded_at = "loaded", time.time()
            model.load_seconds, model.last_used = time.monotonic() - t0, time.monotonic()
            log.info("model %s: loaded in %.2f s (port %d)", model.spec.id, model.load_seconds, child.port)
            self._spawn(self._watch(model, child))
        except (LoadFailed, OSError) as e:
            model.status, model.failure, model.child = "failed", str(e), None
            model.exit_code = child.proc.returncode if child is not None and child.proc else None
            log.error("model %s: failed to load: %s", model.spec.id, e)
        finally:
            model.ready.set_result(None)
            self._admit()

    async def _watch(self, model: Model, child: Child) -> None:
        """A child that ends on its own fails its model (its requests fail; the others go on)."""
        code = await child.wait()
        if model.child is child:
            await child.stop(0)            # its workers go too
            model.status, model.child, model.exit_code = "failed", None, code
            model.failure = f"the model's process ended: {child.reason()}"
            log.error("model %s: %s", model.spec.id, model.failure)
            self._admit()

    async def reap(self) -> None:
        """Unload models idle past their keep-alive, until cancelled."""
        while True:
            await asyncio.sleep(REAP_SECONDS)
            now = time.monotonic()
            for m in list(self.models.values()):
                if m.status == "loaded" and m.active == 0 and m.pending == 0 and \
                        m.expires_at is not None and m.expires_at <= now:
                    self._stop(m)
            self._admit()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        for m in self.models.values():
            if m.running or m.child is not None:
                self._stop(m)
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
