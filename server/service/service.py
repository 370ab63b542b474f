"""The asyncio layer that owns the engine.

One task (`Service._run`) owns the engine: it applies queued adds and cancels
between steps, runs `engine.step()` on a dedicated worker thread (ggml releases
the GIL, so HTTP stays responsive), and routes each TokenEvent to the Job that
asked for it. No other code calls the engine while a step runs. Prompts are built
by the service's PromptBuilder on a thread of their own (`chat_prompt`), from
what never changes after loading, so building one never waits for a step.

Jobs (server/service/jobs.py) turn the engine's TokenEvents into what a client sees.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ggserve.server.chat.prompts import Prompt, PromptBuilder
from ggserve.server.service import burst, heap
from ggserve.server.service.errors import EngineFailed, QueueFull, ServiceError, Unavailable
from ggserve.server.service.jobs import Choice, Job
from ggserve.server.service.metrics import Metrics
from ggserve.server.service.requests import engine_requests

log = logging.getLogger("ggserve.server")

# With RPC workers: how often a call waiting on the engine thread checks whether a
# worker was lost, and how often an idle engine asks its workers (so /health knows)
WATCH_SECONDS = 0.25
HEARTBEAT_SECONDS = 2.0
# the engine gauges of /metrics are read as a request starts or ends, else at most this
# often (_dispatch): after every step they cost the event loop ~80 us a token
STATS_EVERY_SECONDS = 0.1


class WorkerLost(Exception):
    """An RPC worker the model runs on is gone: the engine cannot run any more."""

_ids = itertools.count()


class Service:
    """Owns the engine; see the module docstring."""

    def __init__(self, load_engine: Callable[[], Any], *, n_parallel: int,
                 max_queue: int = 64, metrics: Metrics | None = None,
                 make_request: Callable[..., Any] | None = None,
                 make_decoder: Callable[[Any], Any] | None = None,
                 make_prompts: Callable[[Any], Any] = PromptBuilder.for_engine):
        self._load_engine = load_engine
        self.engine = None
        self.prompts = None                   # PromptBuilder, once the engine is loaded
        self.grammars = None                  # server/chat/grammar.py Grammars, idem
        self._make_prompts = make_prompts
        self.n_parallel = n_parallel
        self.default_max_tokens = -1
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self._make_request = make_request
        self._make_decoder = make_decoder
        self.ready = False
        self.model_name: str | None = None    # the GGUF's name, kept while the engine sleeps
        self.load_error: BaseException | None = None
        self.lost: str | None = None          # why the engine stopped for good (an RPC worker lost)
        self.draining = False                 # shutting down: new requests get 503 (server/cli/shutdown.py)
        self._remote = False                  # does the engine run on RPC workers (which can be lost)?
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ggserve-engine")
        self._prompt_executor = ThreadPoolExecutor(1, thread_name_prefix="ggserve-prompts")
        self._adds: list[tuple[Job, asyncio.Future]] = []
        self._arrivals = burst.Arrivals()
        self._cancels: list[str] = []
        self._stats_at = 0.0                   # when the engine gauges were last read
        self._stepped = False                  # a step ran since the heap was last trimmed
        self._calls: list[tuple[Callable, asyncio.Future]] = []   # on_engine: fn(engine) between steps
        self._live: dict[str, tuple[Job, int]] = {}   # request id -> (job, index)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # -- life cycle -------------------------------------------------------------

    async def start(self) -> None:
        """Load the engine off the loop, then run the step loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._load_and_run(), name="ggserve-engine")

    async def wait_ready(self) -> None:
        while not self.ready:
            if self.load_error is not None:
                raise self.load_error
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self.end_all(Unavailable("Server is shutting down"))
        if self.grammars is not None:
            self.grammars.close()         # its compile workers
        self._adds.clear()
        self._live.clear()
        loop = asyncio.get_running_loop()
        if self.lost is not None:         # the engine thread waits on the lost worker for good
            self._executor.shutdown(wait=False)
            self._prompt_executor.shutdown(wait=False)
            return
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await loop.run_in_executor(self._executor, engine.close)
        self._executor.shutdown(wait=True)
        self._prompt_executor.shutdown(wait=True)

    async def unload(self) -> None:
        """Free the engine (server/service/sleep.py); nothing may be queued or running. reload() loads it again."""
        self.ready = False
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        engine, self.engine = self.engine, None
        await asyncio.get_running_loop().run_in_executor(self._executor, heap.close_engine, engine)

    async def reload(self) -> None:
        self._task = asyncio.create_task(self._load_and_run(), name="ggserve-engine")
        await self.wait_ready()

    async def _load_and_run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.engine = await loop.run_in_executor(self._executor, self._load_engine)
            self.model_name = self.engine.model_name
            self._remote = getattr(self.engine, "remote", False)
            if self._remote:               # a lost worker is watched for from now on (_engine_call)
                self.engine.survive_worker_loss()
            self.prompts = self._make_prompts(self.engine)
            from ggserve.server.chat.grammar import Grammars
            # llguidance's vocabulary and its compile worker come with the first grammar, as
            # llama.cpp builds its llguidance tokenizer at first use: a server that sees none
            # does not hold them (~250 MiB for Gemma 3's 262k tokens: bench/README, memory.py)
            self.grammars = Grammars(self.engine.tokenizer)
            await loop.run_in_executor(self._executor, heap.after_load)
        except Exception as e:
            log.exception("failed to load the model")
            self.load_error = e
            return
        if self._make_request is None:
            from ggserve.server.engine.engine import Request
            self._make_request = Request
        if self._make_decoder is None:
            from ggserve.models.tokenizer import StreamDecoder
            self._make_decoder = StreamDecoder
        self._update_stats()
        self.ready = True
        await self._run()

    # -- requests -----------------------------------------------------------------

    async def chat_prompt(self, messages: list[dict], tools=None, images: list = (), **options) -> Prompt:
        """Chat messages (+ loaded images) -> Prompt, built off the event loop (options: PromptBuilder.chat's)."""
        return await self.on_prompt_thread(functools.partial(self.prompts.chat, messages, tools, images, **options))

    async def on_prompt_thread(self, fn, *args):
        """Run fn (a prompt, a grammar's compilation) on the prompt thread, off the event loop."""
        with self._arrivals.building_one():
            return await asyncio.get_running_loop().run_in_executor(self._prompt_executor, fn, *args)

    async def submit(self, prompts: list[Prompt], params: list, max_tokens: int | None,
                     *, ignore_eos: bool = False, stops: list[str] | None = None,
                     output: Callable[[], Any] | None = None, show_tokens=frozenset(), embed: bool = False,
                     id_slot: int = -1, progress: bool = False, n_keep: int = 0, cache_salt: str = "",
                     adapters: tuple = ()) -> Job:
        """Queue one engine request per prompt (with its SamplingParams); returns the
        Job once the engine took them all (or raises: context length, bad request,
        queue full). output() makes each choice's ChatOutput (reasoning and tool
        calls); show_tokens: control tokens whose text the output keeps (their markers);
        id_slot: the slot the first prompt takes when it is free (llama-server's children take any);
        progress: report prompt processing (Delta.progress); n_keep: what a context shift keeps;
        cache_salt: only requests of the same salt share cached prefixes (Request.cache_salt);
        adapters: the LoRA adapters' (id, scale) pairs (Request.adapters)."""
        self._check_usable()
        if max_tokens is None and not embed:
            max_tokens = self.default_max_tokens          # -n (-1: until the context)
        outstanding = len(self._live) + sum(len(j.choices) for j, _ in self._adds)
        if outstanding + len(prompts) > self.n_parallel + self.max_queue:
            raise QueueFull("Server is busy: too many requests queued; retry later",
                            code="queue_full", retry_after=1)
        base, tok = f"r{next(_ids)}", self.engine.tokenizer
        def decoder():
            if show_tokens:
                from ggserve.server.chat.output import ShowingDecoder
                return ShowingDecoder(tok, show_tokens)
            return self._make_decoder(tok)

        choices = [Choice(f"{base}-{i}", tok, decoder(), stops, output() if output else None)
                   for i in range(len(prompts))]
        job = Job([p.tokens for p in prompts], choices, self.cancel)
        job.requests = engine_requests(
            self._make_request, prompts, job.choices, params, max_tokens=max_tokens, n_ctx=self.engine.n_ctx,
            context_shift=getattr(self.engine, "context_shift", False), ignore_eos=ignore_eos, id_slot=id_slot,
            embed=embed, progress=progress, n_keep=n_keep, cache_salt=cache_salt, adapters=adapters)
        fut = asyncio.get_running_loop().create_future()
        self._adds.append((job, fut))
        self._wake.set()
        try:
            await fut
        except asyncio.CancelledError:
            job.close()
            raise
        self.metrics.prompt_tokens.inc(sum(len(p.tokens) for p in prompts))
        return job

    async def on_engine(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(engine) on the engine thread between two steps (slot files, the
        slots listing); its result, or what it raised."""
        self._check_usable()
        fut = asyncio.get_running_loop().create_future()
        self._calls.append((fn, fut))
        self._wake.set()
        return await fut

    def _check_usable(self) -> None:
        if self.lost is not None:
            raise Unavailable(f"{self.lost}: the server cannot generate until it is restarted",
                              code="worker_lost")
        if not self.ready:
            raise Unavailable("Loading model", code="model_loading", retry_after=5)

    busy = property(lambda self: bool(self._live or self._adds), doc="requests queued or running")

    def end_all(self, err: ServiceError) -> None:
        """End every request with err; closing its job cancels it."""
        for fut in (f for _, f in self._adds if not f.done()):
            fut.set_exception(err)
        for job in {id(j): j for j, _ in self._live.values()}.values():
            job.queue.put_nowait(err)

    def cancel(self, request_id: str) -> None:
        """Cancel an engine request; applied before the next step."""
        if request_id in self._live:
            self._cancels.append(request_id)
            self._wake.set()

    # -- the loop -------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._iteration()
            except asyncio.CancelledError:
                raise
            except WorkerLost as e:
                # what ran fails now (no hang); the engine is never called again
                self.lost = str(e)
                log.error("%s: failing every request; /health reports it", self.lost)
                self._fail_all(Unavailable(f"{self.lost}: the request cannot finish", code="worker_lost"),
                               cancel=False)
                return
            except Exception as e:
                # never let one bad step kill the loop: fail what runs, keep serving
                log.exception("engine loop error")
                self._fail_all(EngineFailed(f"Engine error: {type(e).__name__}: {e}"))

    async def _iteration(self) -> None:
        if self._adds and not self.engine.has_work():
            await self._arrivals.settle()          # requests sent together start together (burst.py)
        calls, self._calls = self._calls, []
        for fn, fut in calls:
            if not fut.done():
                try:
                    fut.set_result(await self._engine_call(fn, self.engine))
                except WorkerLost:
                    fut.set_exception(Unavailable("an RPC worker was lost", code="worker_lost"))
                    raise
                except Exception as e:
                    fut.set_exception(e)
        self._apply()
        if not self.engine.has_work():
            if self._calls:               # one came in while the others ran
                return
            if self._stepped:             # fallen idle: the heap pages the steps freed go back
                self._stepped = False
                await self._engine_call(heap.give_back)
                if self._calls or self._adds:
                    return
            self._wake.clear()
            if not self._remote:
                await self._wake.wait()
                return
            try:
                await asyncio.wait_for(self._wake.wait(), HEARTBEAT_SECONDS)
            except asyncio.TimeoutError:
                await self._engine_call(self.engine.check_workers)
            return
        t0 = time.perf_counter()
        events = await self._engine_call(self.engine.step)
        self._stepped = True
        self.metrics.on_step(time.perf_counter() - t0, events)
        self._dispatch(events)

    async def _engine_call(self, fn, *args):
        """fn(*args) on the engine thread. A call that waits on a lost RPC worker
        never returns (native/ggml_rpc.pxi): with workers, watch for that instead."""
        fut = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        if not self._remote:
            return await fut
        while True:
            done, _ = await asyncio.wait({fut}, timeout=WATCH_SECONDS)
            if done:
                return fut.result()
            lost = self.engine.lost_worker()
            if lost is not None:
                raise WorkerLost(lost)

    def _apply(self) -> None:
        engine = self.engine
        cancels, self._cancels = self._cancels, []
        for rid in cancels:
            if self._live.pop(rid, None) is not None:
                try:
                    engine.cancel(rid)
                except Exception:
                    log.exception("cancel %s failed", rid)
        adds, self._adds = self._adds, []
        for job, fut in adds:
            if fut.done():  # submitter gave up (client gone)
                continue
            added = []
            try:
                for r in job.requests:
                    engine.add(r)
                    added.append(r.id)
            except Exception as e:
                fut.set_exception(e)
                for rid in added:
                    engine.cancel(rid)
                continue
            for i, c in enumerate(job.choices):
                self._live[c.request_id] = (job, i)
            fut.set_result(None)
        if cancels or adds:
            self._update_stats()

    def _dispatch(self, events) -> None:
        now = time.perf_counter()
        m = self.metrics
        started_or_ended = False
        for ev in events:
            entry = self._live.get(ev.request_id)
            if entry is None:
                continue  # cancelled while the step ran
            job, index = entry
            c = job.choices[index]
            m.on_event(ev)
            if ev.token is not None:
                m.generated_tokens.inc()
                if c.t_first is None:
                    c.t_first = now
                    started_or_ended = True
                    m.ttft.observe(now - job.t_submit)
                    m.cached_tokens.inc(ev.n_cached)
                else:
                    m.inter_token.observe(now - c.t_last)
                c.t_last = now
            if ev.finish_reason is not None:
                del self._live[ev.request_id]
                started_or_ended = True
            if getattr(ev, "error", None):        # the engine ended this request alone
                job.choices[index].engine_done = True
                job.queue.put_nowait(EngineFailed(ev.error, code="server_error"))
                continue
            job.queue.put_nowait((index, ev))
        if started_or_ended or now - self._stats_at >= STATS_EVERY_SECONDS:
            self._update_stats()

    def _fail_all(self, err: ServiceError, cancel: bool = True) -> None:
        for job, fut in self._adds:
            if not fut.done():
                fut.set_exception(err)
        self._adds.clear()
        self._cancels.clear()
        for rid, (job, _) in list(self._live.items()):
            if cancel:
                try:
                    self.engine.cancel(rid)
                except Exception:
                    pass
            job.queue.put_nowait(err)
        self._live.clear()
        self._update_stats()

    def _update_stats(self) -> None:
        self._stats_at = time.perf_counter()
        try:
            self.metrics.set_engine_stats(self.engine.stats())
        except Exception:
            log.exception("engine.stats() failed")
