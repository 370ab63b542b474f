"""The engine: runs step plans on a loaded model.

Each step: admitted sequences get a slot (prefix cache), prompts take prefixes
other sequences computed, the scheduler returns a frozen plan, tiles start
encoding, the plan's chunks become one batch, memory records the batch, the graph
runner computes it, then (only if that succeeded) sequences advance and the output
rows are sampled. A failure ends only the requests it concerns (an error
TokenEvent), rolling back what the step recorded. Only one thread may call the
engine at a time; the asyncio service applies add/cancel between steps.

The parts, one job each, are the modules and subpackages beside this one
(docs/architecture.md).
"""
from __future__ import annotations

import functools
import logging
import time
from itertools import accumulate

import numpy as np

from ggserve.native import ggml
from ggserve.server.engine.batch import assemble
from ggserve.server.engine.config import EngineConfig
from ggserve.server.engine.context_shift import shift as shift_context, supported as context_shift_supported
from ggserve.server.engine.graph_runner import GraphRunner
from ggserve.server.engine.images.encoder import BACKGROUND_THREADS, ImageEncoder
from ggserve.server.engine.images.store import ImageStore
from ggserve.server.engine.kernel_parity import KernelParity
from ggserve.server.engine.loader import LoadedModel
from ggserve.server.engine.memory import sizing, slot_files
from ggserve.server.engine.memory.host_cache import HostCache
from ggserve.server.engine.memory.kv_cache import MAX_SEQS
from ggserve.server.engine.memory.model_memory import Memory
from ggserve.server.engine.memory.prefix_cache import PrefixCache
from ggserve.server.engine.memory.snapshot import layout as snapshot_layout
from ggserve.server.engine.pooling import Pool, from_gguf
from ggserve.server.engine.request_checks import check_request
from ggserve.server.engine.sampling.sampler import SamplingParams, sample_batch
from ggserve.server.engine.scheduler import Scheduler, StepPlan
from ggserve.server.engine.sequence import Request, Sequence, TokenEvent, progress_event
from ggserve.server.engine.speculative.speculator import SpecConfig, Speculator
from ggserve.server.request_errors import ContextLengthExceeded  # noqa: F401  (re-exported)

__all__ = ["Engine", "EngineConfig", "Request", "TokenEvent", "ContextLengthExceeded", "SamplingParams"]

log = logging.getLogger("ggserve.engine")


class Engine:
    def __init__(self, cfg: EngineConfig):
        t0 = time.perf_counter()
        if not 1 <= cfg.n_parallel <= MAX_SEQS:
            raise ValueError(f"n_parallel must be in 1..{MAX_SEQS}")
        if cfg.n_batch < 1:
            raise ValueError("n_batch must be >= 1")
        self.cfg = cfg
        n_parallel, n_batch = self.n_parallel, self.n_batch = cfg.n_parallel, cfg.n_batch
        self.loaded = LoadedModel(cfg.model, n_threads=cfg.n_threads, n_gpu_layers=cfg.n_gpu_layers,
                                  n_parallel=n_parallel, chat_template=cfg.template_source(), mmproj=cfg.mmproj,
                                  rpc=cfg.rpc, tensor_split=cfg.tensor_split, use_mmap=cfg.use_mmap,
                                  mlock=cfg.mlock, cpu_kernels=cfg.cpu_kernels, adapters=cfg.adapters)
        lm = self.loaded
        self.n_ctx_train = int(lm.gguf.metadata.get(f"{lm.gguf.architecture}.context_length", 0))
        specs = sizing.layer_specs(lm.model, lm.device_of_layer, cfg.swa_full)
        self.kv_size, self.n_ctx = sizing.fit_context(cfg, lm, specs, self.n_ctx_train)    # as llama.cpp's
        self.tokenizer, self.model, self.vision, self.backend = lm.tokenizer, lm.model, lm.vision, lm.backend
        self.n_threads = self.backend.n_threads       # -t: a step of one row; -tb (0: as -t): larger steps
        self.n_threads_batch = cfg.n_threads_batch if cfg.n_threads_batch > 0 else self.n_threads
        self.n_pos = getattr(self.model, "n_pos", 1)
        self.model_path, self.model_name = lm.path, lm.name
        self.memory = Memory(self.backend, specs, kv_size=self.kv_size, unified=cfg.kv_unified,
                             n_seqs=n_parallel, checkpoints=cfg.checkpoints, n_pos=self.n_pos, n_ubatch=n_batch,
                             type_k=ggml.type_by_name(cfg.cache_type_k), type_v=ggml.type_by_name(cfg.cache_type_v))
        self.kv = self.memory.kv
        self.context_shift = cfg.context_shift and context_shift_supported(self.model, self.memory, lm.media)
        if cfg.context_shift and not self.context_shift:
            log.warning("context shift is not supported by this model (or with a projector): disabled")
        self.n_bos = 1 if self.tokenizer.vocab.add_bos else 0       # a context shift keeps it (llama-server)
        self.parity = KernelParity(cfg.kernel_parity, lm.kernel_of,
                                   self.kv.has_swa or self.memory.recurrent is not None)
        self.encoder = ImageEncoder(lm.media, lm.device_of_layer(0), self.n_threads) if lm.media else None
        self.images = ImageStore(cfg.image_cache_mb * 2**20)
        self.scheduler = Scheduler(n_parallel, n_batch, cfg.max_stall_ms / 1000)
        ram = cfg.cache_ram_mb
        self.slots = PrefixCache(n_parallel, self.memory, cfg.slot_prompt_similarity,
                                 HostCache(ram * 2**20 if ram > 0 else 2**62) if ram else None)
        self.runner = GraphRunner(self.backend, self.model, self.memory, self.parity, self.n_pos, lm.adapters)
        # embeddings (--embeddings): the pooling, the GGUF's unless given (server/engine/pooling.py)
        self.pooling = (cfg.pooling or from_gguf(lm.gguf.metadata)) if cfg.embeddings else None
        if self.pooling == "rank" and any(n.startswith("cls") for n in lm.gguf.tensors):
            raise ValueError("this model has a classification head (cls.* tensors), which ggserve's "
                             "reranking does not apply: it scores causal models by their last hidden state")
        self.runner.reserve(n_batch, n_parallel, embeddings=cfg.embeddings)
        if lm.media is not None:
            lm.media.reserve()
        self.spec = Speculator.build(cfg.spec or SpecConfig(type="none"), self.memory, self.tokenizer,
                                     n_ctx=self.kv_size, n_batch=n_batch, n_parallel=n_parallel, n_threads=self.n_threads)
        self.load_seconds = time.perf_counter() - t0
        self.last_step_seconds = 0.0

    chat_template = property(lambda self: self.loaded.chat_template)
    graph_builds = property(lambda self: self.runner.graph_builds)

    @property
    def last_compute_seconds(self) -> float:
        return self.runner.last_compute_seconds

    # -- requests ----------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request. Its fields are checked here, once (sampling parameters
        check themselves when made)."""
        check_request(request, n_ctx=self.n_ctx, n_pos=self.n_pos, n_vocab=self.tokenizer.n_vocab,
                      n_batch=self.n_batch, embeddings=self.pooling is not None)
        self.images.pin(request.images)
        seq = Sequence(request)
        seq.state_points = self.memory.state_points(len(request.prompt), request.turn_starts)
        if request.embed:
            seq.pool = Pool(self.pooling, len(request.prompt))
        self.scheduler.add(seq)

    def cancel(self, request_id: str) -> None:
        seq = self.scheduler.remove(request_id)
        if seq is not None:
            self._leave(seq, keep=False)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def stats(self) -> dict:
        return {"kv_used": self.memory.n_used, "kv_total": self.kv.size,
                "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "image_cache_hits": self.images.hits, "image_cache_misses": self.images.misses,
                "images_encoded": self.images.encoded, **self.spec.stats()}

    def clear_cache(self) -> None:
        """Forget every cached prefix (only between requests: nothing may be running)."""
        if self.scheduler.running:
            raise RuntimeError("cannot clear the KV cache while sequences are running")
        self.slots.clear()

    # -- the step ----------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        t0 = time.perf_counter()
        events = self._admit() + self._collect_tile()
        if self.context_shift:
            events += [self._end(s, None, "length") for s in list(self.scheduler.running)
                       if not shift_context(s, self.memory, self.model, self.n_ctx, self.n_bos)]
        if self.spec.on:
            self.spec.propose([s for s in self.scheduler.running if not s.prefilling and s.n_pending == 1
                               and s.pool is None], self.n_ctx, self.scheduler.decode_cost.fit())
        plan = self.scheduler.plan(self.slots.share(self.scheduler.running), self.images.__contains__,
                                   self.encoder is not None and self.encoder.idle())
        if plan.encode_first is not None:
            return events + self._encode_first(plan.encode_first)
        if not plan.chunks:
            return events
        if plan.encode is not None:
            self.images.miss(plan.encode)
            self.encoder.start(plan.encode.key, plan.encode.tile)
        batch = assemble(plan.chunks, self._use_tiles(plan), self.n_pos)
        seqs, counts = batch.per_sequence()
        cells = None
        while self.kv.n_free < batch.n and self.slots.evict_idle():
            pass            # a KV cache the slots share: idle slots give way (to host RAM)
        try:
            cells = self.memory.begin_step(seqs, counts, batch.seq_ids, batch.positions, batch.span_ids)
            logits = self.runner.run(batch, cells, self._cores_for_text(batch.n))
        except Exception as e:            # the batch could not run: its requests end, nothing else
            log.exception("step failed")
            if cells is not None:
                self.memory.undo_step(cells, seqs)
            return events + [self._fail(c.seq, f"the step failed: {e}") for c in plan.chunks]
        self.memory.end_step(seqs, counts, [c.seq.slot for c in plan.chunks if c.start + c.n in c.seq.state_points])
        first = list(accumulate(counts, initial=0))
        cells_of = {id(c): cells[first[i]:first[i + 1]] for i, c in enumerate(plan.chunks) if c.draft}
        for c in plan.chunks:
            c.seq.advance(c.n)          # a drafted chunk takes back its rejected rows (_verify)
        events += [progress_event(c.seq) for c in plan.chunks if c.seq.request.progress and c.start < c.seq.n_prompt]
        events += self._sample(batch.out_chunks, logits, cells_of)
        events += self._pool(batch, self.runner.last_hidden)
        self.last_step_seconds = time.perf_counter() - t0
        self.scheduler.observe(batch.n, self.runner.last_compute_seconds, self.last_step_seconds)
        return events

    def _admit(self) -> list[TokenEvent]:
        events = []
        for seq in self.scheduler.admit():
            self.slots.assign(seq)
            if seq.request.progress:
                events.append(progress_event(seq))
            if seq.request.max_tokens == 0 and not seq.request.embed:
                events.append(self._end(seq, None, "length"))
        return events

    def _sample(self, chunks, logits, cells_of: dict) -> list[TokenEvent]:
        """Sample each output row (all rows of a drafted chunk: _verify); a chunk
        with a row that is not finite ends its request alone."""
        if not chunks:
            return []
        finite = np.isfinite(logits.max(axis=1))      # a NaN or +inf anywhere in a row shows in its max
        events, plain, rows, drafted, row = [], [], [], [], 0
        for c in chunks:
            n = c.n if c.draft else 1
            if not finite[row:row + n].all():
                events.append(self._fail(c.seq, "the model produced non-finite logits"))
            elif c.draft:
                drafted.append((c, logits[row:row + n]))
            else:
                plain.append(c)
                rows.append(row)
            row += n
        if plain:
            results = sample_batch(logits if len(rows) == len(logits) else logits[rows],
                                   [c.seq.sampler for c in plain])
            events += [self._on_token(c.seq, r) for c, r in zip(plain, results)]
        for c, rows_logits in drafted:
            events += self._verify(c, rows_logits, cells_of[id(c)])
        return events

    def _verify(self, c, logits, cells) -> list[TokenEvent]:
        """A drafted chunk: its rows sampled in order, each with the sampler state the
        tokens before it left, while the token equals the drafted one (the last row's
        token comes after the whole draft); the rows after the last token sampled
        leave the KV cache (server/engine/speculative/speculator.py)."""
        seq, draft = c.seq, c.draft
        results, reason = [], None
        for j in range(len(draft) + 1):
            r = sample_batch(logits[j:j + 1], [seq.sampler])[0]
            results.append(r)
            reason = self._take(seq, r)
            if reason is not None or j == len(draft) or r.token != draft[j]:
                break
        accepted = sum(1 for r, d in zip(results, draft) if r.token == d)
        self.spec.record(seq, len(draft), accepted)
        if len(results) < c.n:
            self.memory.drop(cells[len(results):])
            seq.forget(c.n - len(results))
        events = [self._event(seq, r, None) for r in results[:-1]]
        return events + [self._on_token(seq, results[-1], reason)]

    def _pool(self, batch, hidden) -> list[TokenEvent]:
        """Embedding chunks: their rows' hidden states go to their pools; a chunk that
        ends its prompt ends its request with the result."""
        events, row = [], 0
        for c, k in batch.hidden_chunks:
            c.seq.pool.add(hidden[row:row + k])
            row += k
        for c in batch.chunks:
            if c.seq.pool is not None and c.start + c.n == c.seq.n_prompt:
                seq = c.seq
                self.scheduler.remove(seq.id)
                self._leave(seq, keep=True)
                events.append(TokenEvent(seq.id, None, None, [], "stop", seq.n_prompt, 0,
                                         embedding=seq.pool.result()))
        return events

    def _use_tiles(self, plan: StepPlan) -> ImageStore:
        """The store, with the tiles the chunks reach counted (ImageStore.reach)."""
        for c in plan.chunks:
            for span in c.seq.images:
                if span.start < c.start + c.n and span.end > c.start:
                    self.images.reach(span)
        return self.images

    def _collect_tile(self, wait: bool = False) -> list[TokenEvent]:
        """Store a tile the encoder finished (kept even if its request is gone)."""
        if self.encoder is None or self.encoder.idle():
            return []
        key = self.encoder.key
        try:
            done = self.encoder.collect(wait)
        except Exception as e:
            return self._fail_tile(key, e)
        if done is not None:
            self.images.put(*done)
        return []

    def _encode_first(self, span) -> list[TokenEvent]:
        """No row can run without this tile: wait for the tile in flight, or encode it here."""
        if not self.encoder.idle():
            return self._collect_tile(wait=True)
        self.images.miss(span)
        try:
            emb = self.encoder.encode_now(span.tile)
        except Exception as e:
            return self._fail_tile(span.key, e)
        self.images.put(span.key, emb)
        return []

    def _fail_tile(self, key, error) -> list[TokenEvent]:
        log.error("image tile %s failed to encode: %s", key, error)
        return [self._fail(s, f"an image could not be encoded: {error}")
                for s in list(self.scheduler.running) if any(sp.key == key for sp in s.images)]

    def _cores_for_text(self, n_rows: int) -> int:
        """CPU threads for a step of n_rows (llama.cpp's -t for one row, -tb for more):
        fewer while a tile encodes beside it."""
        n = self.n_threads if n_rows == 1 else self.n_threads_batch
        return max(1, n - BACKGROUND_THREADS) if self.encoder is not None and self.encoder.busy() else n

    def _take(self, seq: Sequence, r) -> str | None:
        """A sampled token joins its sequence. -> why the sequence ends now, or None."""
        seq.tokens.append(r.token)
        seq.n_generated += 1
        seq.sampler.accept(r.token)
        if self.tokenizer.is_eog(r.token) and not seq.request.ignore_eos:
            return "stop"
        if seq.n_generated >= seq.request.max_tokens or (len(seq.tokens) >= self.n_ctx and not self.context_shift):
            return "length"
        return None

    def _on_token(self, seq: Sequence, r, reason: str | None = ...) -> TokenEvent:
        """The event of a sampled token (taken here unless given its reason); a
        sequence that ends leaves its slot."""
        if reason is ...:
            reason = self._take(seq, r)
        if reason is not None:
            self.scheduler.remove(seq.id)
            self._leave(seq, keep=True)
        return self._event(seq, r, reason)

    def _event(self, seq: Sequence, r, reason: str | None) -> TokenEvent:
        return TokenEvent(seq.id, r.token, r.logprob, r.top, reason, seq.n_prompt, seq.n_cached,
                          n_draft=seq.n_draft, n_draft_accepted=seq.n_draft_accepted)

    def _end(self, seq: Sequence, token, reason, error: str | None = None) -> TokenEvent:
        self.scheduler.remove(seq.id)
        self._leave(seq, keep=error is None)
        return TokenEvent(seq.id, token, None, [], reason, seq.n_prompt, seq.n_cached, error)

    def _fail(self, seq: Sequence, why: str) -> TokenEvent:
        return self._end(seq, None, "error", why)

    def _leave(self, seq: Sequence, keep: bool) -> None:
        if seq.slot >= 0:     # (a shifted sequence's cells no longer equal its tokens computed afresh)
            self.slots.release(seq, keep and not seq.n_discarded)
        self.images.unpin(seq.images)

    # -- resources -----------------------------------------------------------------

    @property
    def remote(self) -> bool:
        """Does the model use RPC workers (which can be lost: lost_worker)?"""
        return self.loaded.remote

    def lost_worker(self) -> str | None:
        """Why the engine cannot run any more (an RPC worker lost), else None."""
        return self.loaded.lost_worker()

    def check_workers(self) -> None:
        """An idle engine's heartbeat: one round trip to each RPC worker."""
        self.loaded.check_workers()

    def survive_worker_loss(self) -> None:
        """A lost RPC worker leaves the process running from now on (the default is
        to exit): for a caller that watches lost_worker and fails the requests."""
        self.loaded.survive_worker_loss()

    def memory_report(self) -> str:
        return self.loaded.memory_report(self.memory.nbytes_by_device())

    # -- slots, between steps: llama-server's /slots actions ----------------------

    def slot_running(self, slot: int) -> bool:
        return slot in self.slots.running

    def erase_slot(self, slot: int) -> int:
        """Forget what an idle slot holds. -> tokens erased."""
        return self.slots.erase(slot)

    def save_slot(self, slot: int, path: str) -> tuple[int, int] | None:
        """An idle slot's tokens and memory to a slot file. -> (tokens, bytes written),
        None when it holds no tokens."""
        snap = self.slots.snapshot(slot)
        if snap is None:
            return None
        return snap.n, slot_files.save(path, snap, self._fingerprint, snapshot_layout(self.memory))

    def restore_slot(self, slot: int, path: str) -> tuple[int, int]:
        """A slot file into an idle slot. -> (tokens restored, tokens in the file):
        fewer restored when the KV cache has no room for them."""
        snap = slot_files.load(path, self._fingerprint, snapshot_layout(self.memory), self.n_ctx)
        return self.slots.load(slot, snap), snap.n

    @functools.cached_property
    def _fingerprint(self) -> str:
        return slot_files.model_fingerprint(self.loaded.gguf)

    def close(self):
        self.spec.close()
        self.runner.close()
        if self.encoder is not None:
            self.encoder.close()
        self.images.close()
        self.memory.close()
        self.loaded.close()
