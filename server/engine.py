"""The engine: a model, its KV cache and the step that runs one batch.

`step()` asks the scheduler for this step's chunks (plain data), turns them into
one batch of tensors, runs the forward pass (ggml releases the GIL), samples the
output rows and returns TokenEvents. Only one thread may call the engine at a
time; the asyncio service applies add/cancel between steps.

KV slots follow llama-server: `n_parallel` slots, each limited to
n_ctx // n_parallel tokens, so running sequences can never run out of cells. A
finished sequence's cells stay in its slot: a later prompt with the same prefix
(in that slot, or shared from any other slot) skips recomputing it.
"""
from __future__ import annotations

import functools
import logging
import os
import time

import numpy as np

from ggserve.models.inputs import TILED_TYPES, ForwardInputs, RowPlan, batched_rows, solo_ubatches
from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.models.weights import matmul_weight_names
from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.image_encoder import BACKGROUND_THREADS, ImageEncoder
from ggserve.server.kv_cache import MAX_SEQS, KVCache
from ggserve.server.sampling import SamplingParams, sample_batch
from ggserve.server.scheduler import Scheduler
from ggserve.server.sequence import Request, Sequence, TokenEvent

__all__ = ["Engine", "Request", "TokenEvent", "EngineError", "ContextLengthExceeded", "SamplingParams"]

log = logging.getLogger("ggserve.engine")


SHARE_MIN_TOKENS = 32      # a prefix worth waiting for / copying from another sequence
ROW_COST_MIN_ROWS = 64     # steps this big or bigger measure the compute cost of a row


class EngineError(RuntimeError):
    pass


class ContextLengthExceeded(ValueError):
    pass


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Engine:
    def __init__(self, model_path: str, *, n_ctx: int = 4096, n_batch: int = 512,
                 n_parallel: int = 4, n_threads: int = 0, n_gpu_layers: int = 0,
                 cache_type_k: str = "f16", cache_type_v: str = "f16",
                 chat_template: str | None = None, mmproj: str | None = None,
                 image_cache_mb: int = 256, max_stall_ms: float = 0.0):
        t0 = time.perf_counter()
        self.model_path = os.fspath(model_path)
        self.gguf = GGUFFile(self.model_path)
        meta = self.gguf.metadata
        arch = self.gguf.architecture
        cls = model_class(arch, self.model_path)
        self.model_name = meta.get("general.name") or os.path.splitext(os.path.basename(self.model_path))[0]
        if not 1 <= n_parallel <= MAX_SEQS:
            raise ValueError(f"n_parallel must be in 1..{MAX_SEQS}")
        if n_batch < 1:
            raise ValueError("n_batch must be >= 1")
        self.n_parallel = n_parallel
        self.n_batch = n_batch
        self.kv_size = n_ctx
        self.n_ctx = n_ctx // n_parallel
        if self.n_ctx < 8:
            raise ValueError(f"context {n_ctx} split over {n_parallel} slots leaves {self.n_ctx} tokens per slot")

        self.tokenizer = Tokenizer.from_metadata(meta)
        self._chat_template_override = chat_template

        n_layer = meta.get(f"{arch}.block_count", 0)
        # graph size: ~60 nodes per layer plus 6 per attention call (at most one per sequence)
        max_nodes = max(16384, n_layer * (64 + 6 * n_parallel) + 4096)
        self.backend = ggml.Backend(n_threads=n_threads, max_nodes=max_nodes)
        self._device_of_layer = self._placement(n_layer, n_gpu_layers)
        matmul_names = matmul_weight_names(self.gguf.tensors)
        self.weights = self.backend.load_weights(self.gguf, self._tensor_placement(n_layer, n_gpu_layers),
                                                 repack=matmul_names)
        if self.backend.gpus and n_gpu_layers > n_layer:
            self._duplicate_tied_output(self.backend.gpus[0])
        tensors = {}
        for buf in self.weights.values():
            tensors.update(buf.tensors)
        # weights whose CPU kernel depends on the row count of the call (models.inputs.RowPlan)
        self.kernel_of = {}
        for key, buf in self.weights.items():
            if not buf.device.is_cpu:
                continue
            for name, t in buf.tensors.items():
                if key == "CPU_REPACK":
                    self.kernel_of[t] = "repack"
                elif name in matmul_names and ggml.type_name(t.type) in TILED_TYPES:
                    self.kernel_of[t] = "tiled"
        self._kernel_kinds = sorted(set(self.kernel_of.values()))
        self.model = cls(meta, tensors, self.model_path)
        self.kv = KVCache(self.backend, self.model.kv_layers(self._device_of_layer), self.kv_size,
                          ggml.type_by_name(cache_type_k), ggml.type_by_name(cache_type_v),
                          n_regions=n_parallel)
        self.vision = None
        self._encoder: ImageEncoder | None = None
        self.n_threads = self.backend.n_threads
        if mmproj is not None:
            from ggserve.models.vision import VisionModel

            # a backend of its own: tiles encode on a worker thread beside text steps,
            # kept on the device of the first text layer (no round trip through the host)
            self.vision = VisionModel.from_gguf(mmproj, ggml.Backend(n_threads=self.n_threads))
            if self.vision.n_embd_out != self.model.n_embd:
                raise ModelError(f"{mmproj}: projects to {self.vision.n_embd_out} dims, "
                                 f"the text model has {self.model.n_embd}")
            self._encoder = ImageEncoder(self.vision, self._device_of_layer(0), self.n_threads)
        self.images = ImageStore(image_cache_mb * 2**20)
        self.scheduler = Scheduler(n_parallel, n_batch)
        # while streams decode, steps are sized to take about this long (0: no cap),
        # from the measured compute time per batch row
        self.max_stall = max(0.0, max_stall_ms) / 1000
        self._row_seconds = 0.0
        self._slot_seq: dict[int, Sequence] = {}                         # busy slot -> its sequence
        self._slot_cache: list[list[int]] = [[] for _ in range(n_parallel)]  # what an idle slot's KV holds
        self._slot_used_at = [0.0] * n_parallel
        self._reserve()
        self._graph: BuiltGraph | None = None     # the last step's graph, reused while the shape holds
        self.graph_builds = 0
        self.load_seconds = time.perf_counter() - t0
        self.last_compute_seconds = 0.0
        self.last_step_seconds = 0.0

    # -- loading -----------------------------------------------------------------

    @functools.cached_property
    def chat_template(self):
        """The model's chat template (or the override given at construction)."""
        from ggserve.models.chat_template import ChatTemplate

        override = self._chat_template_override
        if override is not None:
            tok = self.tokenizer
            return ChatTemplate(override, bos_token=tok.id_to_token(tok.bos_id) if tok.bos_id >= 0 else "",
                                eos_token=tok.id_to_token(tok.eos_id) if tok.eos_id >= 0 else "")
        return ChatTemplate.from_metadata(self.gguf.metadata)

    def _placement(self, n_layer, n_gpu_layers):
        gpus = self.backend.gpus
        cpu = self.backend.cpu
        if not gpus or n_gpu_layers <= 0:
            return lambda il: cpu
        first_gpu_layer = max(0, n_layer - n_gpu_layers)
        return lambda il: gpus[0] if il >= first_gpu_layer else cpu

    def _tensor_placement(self, n_layer, n_gpu_layers):
        """llama.cpp's rule: the last n_gpu_layers blocks on the GPU, the output
        layer too when n_gpu_layers > n_layer; token embeddings stay on the CPU."""
        gpus = self.backend.gpus
        if not gpus or n_gpu_layers <= 0:
            return {}
        place = {}
        for name in self.gguf.tensors:
            if name.startswith("blk."):
                il = int(name.split(".")[1])
                place[name] = self._device_of_layer(il)
            elif name.startswith("output") and n_gpu_layers > n_layer:
                place[name] = gpus[0]
        return place

    def _duplicate_tied_output(self, device):
        """A model whose output matrix is its token embeddings (tied) gets a copy of
        them on `device` as "output.weight", as llama.cpp duplicates them: the
        embeddings stay on the CPU for their row lookups while the vocabulary-sized
        output product runs where the layers run."""
        if "output.weight" in self.gguf.tensors or "token_embd.weight" not in self.gguf.tensors:
            return
        embd = next(b.tensors["token_embd.weight"] for b in self.weights.values() if "token_embd.weight" in b)
        buf = self.backend.alloc(device, [("output.weight", embd.type, embd.ne)])
        buf["output.weight"].copy_from(embd)
        self.weights[f"{device.name} (tied output)"] = buf

    def _reserve(self):
        """Size compute buffers for the worst case: a full batch attending over the whole cache."""
        n = self.n_batch
        g = self.backend.graph()
        try:
            tokens = g.input("tokens", ggml.I32, (n,))
            pos = g.input("pos", ggml.I32, (n,))
            out_ids = g.input("out_ids", ggml.I32, (min(n, self.n_parallel),))
            st = self.kv.declare(g, n, self.kv.worst_case_calls(n))
            g.output(self.model.forward(g, ForwardInputs(tokens, pos, out_ids, st, n)))
            self.backend.reserve(g)
        finally:
            g.close()
        if self.vision is not None:
            g = self.vision.max_graph()
            try:
                self.vision.backend.reserve(g)
            finally:
                g.close()

    def memory_report(self) -> str:
        lines = []
        kv = self.kv.nbytes_by_device()
        for dev in self.backend.devices:
            w = sum(b.nbytes for b in self.weights.values() if b.device is dev)
            c = self.backend.compute_bytes.get(dev.name, 0)
            if self.vision is not None:
                c += self.vision.backend.compute_bytes.get(dev.name, 0)
            k = kv.get(dev.name, 0)
            if self.vision is not None and dev is self.backend.devices[0]:
                w += self.vision.nbytes
            lines.append(f"{dev.name} ({dev.description}): weights {w / 2**20:.1f} MiB, "
                         f"KV cache {k / 2**20:.1f} MiB, compute {c / 2**20:.1f} MiB")
        if self.vision is not None:
            lines.append(f"vision ({self.vision.projector}): weights {self.vision.nbytes / 2**20:.1f} MiB "
                         f"(included above); compute reserved for its largest image")
        return "\n".join(lines)

    def close(self):
        if self._graph is not None:
            self._graph.graph.close()
            self._graph = None
        if self._encoder is not None:
            self._encoder.close()
        if self.vision is not None:
            self.vision.close()
            self.vision.backend.close()
        self.kv.close()
        for b in self.weights.values():
            b.close()
        self.weights = {}
        self.backend.close()

    # -- prompts -------------------------------------------------------------------

    def build_prompt(self, text: str, images: list = ()) -> tuple[list[int], list]:
        """Rendered chat text with one media marker per image -> (tokens, image spans).

        images: (sha256, PIL image) pairs in marker order. Without images the text is
        tokenized as llama-server does (BOS per the model, special tokens parsed).
        """
        from ggserve.models.vision.arrange import MEDIA_MARKER, arrange

        parts = text.split(MEDIA_MARKER)
        if len(parts) - 1 != len(images):
            raise ValueError(f"the prompt has {len(parts) - 1} image markers for {len(images)} images")
        if not images:
            return self.tokenizer.encode(text, add_special=True, parse_special=True), []
        if self.vision is None:
            raise ValueError("this model does not support images (start the server with --mmproj)")
        pieces = [parts[0]]
        for (sha, image), after in zip(images, parts[1:]):
            pieces.append((sha, self.vision.preprocess(image)))
            pieces.append(after)
        return arrange(self.vision.projector, self.tokenizer, pieces, self.vision.tokens_per_tile)

    def turn_starts(self, prompt: list[int], spans=()) -> tuple[int, ...]:
        """Positions of the first and the last user turn of a chat prompt, where
        llama-server starts a new batch for models with a sliding window (to save a
        context checkpoint there). () for other models."""
        if not self.kv.has_swa:
            return ()
        opener = self._user_turn_opener
        if not opener:
            return ()
        images = {i for span in spans for i in range(span.start, span.end)}
        k = len(opener)
        found = [i for i in range(len(prompt) - k + 1)
                 if prompt[i:i + k] == opener and not images.intersection(range(i, i + k))]
        return tuple(sorted({found[0], found[-1]})) if found else ()

    @functools.cached_property
    def _user_turn_opener(self) -> list[int]:
        """The tokens that open a user turn in this model's chat template, as
        llama.cpp's template analysis finds them: the role marker before a probe
        message's text (from its last special token that names a role, or for
        templates written in plain text, from the last '<')."""
        probe = "\u2063probe\u2063"
        try:
            text = self.chat_template.render([{"role": "user", "content": probe}], add_generation_prompt=False)
        except Exception:            # a template that refuses the probe: no turn cuts
            return []
        if probe not in text:
            return []
        tok = self.tokenizer
        pre = text[:text.index(probe)].rstrip()
        bos = tok.id_to_token(tok.bos_id) if tok.bos_id is not None and tok.bos_id >= 0 else ""
        if bos and pre.startswith(bos):
            pre = pre[len(bos):]
        ids = tok.encode(pre, add_special=False, parse_special=True)
        marks = [i for i in range(len(ids) - 1) if tok.is_special(ids[i]) and not tok.is_special(ids[i + 1])]
        if marks:
            return ids[marks[-1]:]
        return tok.encode(pre[pre.rfind("<"):] if "<" in pre else pre, add_special=False, parse_special=True)

    # -- requests ----------------------------------------------------------------

    def add(self, request: Request) -> None:
        request.params.validate()
        if not request.prompt:
            raise ValueError("the prompt is empty")
        if len(request.prompt) + 1 > self.n_ctx:
            raise ContextLengthExceeded(
                f"the prompt has {len(request.prompt)} tokens; the context per sequence is {self.n_ctx}")
        if request.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        rows = {i for span in request.images for i in range(span.start, span.end)}
        bad = [t for i, t in enumerate(request.prompt) if i not in rows and not 0 <= t < self.tokenizer.n_vocab]
        if request.images and self.vision is None:
            raise ValueError("this model does not support images (start the server with --mmproj)")
        too_long = [s for s in request.images if s.bidirectional and s.n > self.n_batch]
        if too_long:
            raise ValueError(f"an image needs {too_long[0].n} tokens in one batch; the batch size is {self.n_batch}")
        if bad:
            raise ValueError(f"token id {bad[0]} is out of the vocabulary (0..{self.tokenizer.n_vocab - 1})")
        self.scheduler.add(Sequence(request))

    def cancel(self, request_id: str) -> None:
        seq = self.scheduler.remove(request_id)
        if seq is not None and seq.slot >= 0:
            self._release(seq, keep=False)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def stats(self) -> dict:
        return {
            "kv_used": self.kv.n_used,
            "kv_total": self.kv.size,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "image_cache_hits": self.images.hits,
            "image_cache_misses": self.images.misses,
            "images_encoded": self.images.encoded,
        }

    def clear_cache(self) -> None:
        """Forget every cached prefix (only between requests: nothing may be running)."""
        if self.scheduler.running:
            raise EngineError("cannot clear the KV cache while sequences are running")
        self.kv.clear()
        self._slot_cache = [[] for _ in range(self.n_parallel)]

    # -- slots and prefix reuse ----------------------------------------------------

    def _slot_tokens(self, slot: int) -> list[int]:
        """The tokens whose K/V a slot holds: its running sequence's computed tokens,
        or what the last sequence in it left behind."""
        seq = self._slot_seq.get(slot)
        return seq.tokens[: seq.n_computed] if seq is not None else self._slot_cache[slot]

    def _assign_slot(self, seq: Sequence) -> None:
        """Give seq a free slot, reusing the longest cached prefix of its prompt."""
        prompt = seq.tokens
        shared = [_common_prefix(self._slot_tokens(s), prompt) for s in range(self.n_parallel)]
        free = [s for s in range(self.n_parallel) if s not in self._slot_seq]
        # the free slot whose own cache shares most; ties: least recently used
        slot = max(free, key=lambda s: (shared[s], -self._slot_used_at[s]))
        # a longer prefix in another slot (running or idle) is shared instead
        best_src = max(range(self.n_parallel), key=lambda s: (shared[s], s == slot))
        best = shared[best_src]
        # always compute at least the last prompt token: its logits start generation
        reuse = min(best, len(prompt) - 1)
        span = seq.span_at(reuse)
        if span is not None and span.bidirectional:
            reuse = span.start     # a bidirectional image is reused whole or not at all
        self.kv.seq_rm(slot, 0 if best_src != slot else reuse)
        if best_src != slot and reuse > 0 and not self.kv.seq_copy(self.backend, best_src, slot, reuse):
            self.kv.seq_cp(best_src, slot, 0, reuse)     # no room to copy: share the cells
        seq.slot = slot
        seq.n_computed = reuse
        seq.n_cached = reuse
        self._slot_seq[slot] = seq

    def _share_prefixes(self) -> set[str]:
        """Prompts that share a prefix with another running sequence which is ahead
        take its K/V instead of computing it again: what it has computed is copied
        now; while it still computes more of the shared part, they wait (returned:
        their ids). Many requests arriving together with one long, uncached system
        prompt then compute it once instead of once each."""
        running = [s for s in self.scheduler.running if s.slot >= 0]
        rank = {id(s): (-s.n_computed, i) for i, s in enumerate(running)}   # lower: further ahead
        held = set()
        for b in running:
            if not b.prefilling:
                continue
            best, leader = 0, None
            for a in running:
                if a is not b and rank[id(a)] < rank[id(b)]:
                    shared = min(_common_prefix(a.tokens, b.tokens[:b.n_prompt]), b.n_prompt - 1)
                    if shared > best:
                        best, leader = shared, a
            if leader is None or best - b.n_computed < SHARE_MIN_TOKENS:
                continue
            ready = min(best, leader.n_computed)
            span = b.span_at(ready)
            if span is not None and span.bidirectional:
                ready = span.start     # an image is taken whole or not at all
            if ready - b.n_computed >= SHARE_MIN_TOKENS:
                self.kv.seq_rm(b.slot)
                if not self.kv.seq_copy(self.backend, leader.slot, b.slot, ready):
                    self.kv.seq_cp(leader.slot, b.slot, 0, ready)
                b.n_computed = b.n_cached = ready
            if leader.n_computed < best:
                held.add(b.id)
        return held

    def _release(self, seq: Sequence, keep: bool) -> None:
        slot = seq.slot
        if not keep:
            self.kv.seq_rm(slot)
        self._slot_cache[slot] = seq.tokens[: seq.n_computed] if keep else []
        self._slot_used_at[slot] = time.monotonic()
        del self._slot_seq[slot]
        seq.slot = -1

    # -- the step ----------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        t0 = time.perf_counter()
        events: list[TokenEvent] = []
        for seq in self.scheduler.admit():
            self._assign_slot(seq)
            if seq.request.max_tokens == 0:
                events.append(self._finish(seq, None, "length"))
        max_rows = None
        if self.max_stall:      # before the first measurement: the smallest prompt chunk
            max_rows = int(self.max_stall / self._row_seconds) if self._row_seconds else 0
        chunks = self._encode_images(self.scheduler.schedule(max_rows, self._share_prefixes()))
        if not chunks:
            return events

        tokens = np.concatenate([np.asarray(c.seq.tokens[c.start:c.start + c.n], dtype=np.int64) for c in chunks])
        positions = np.concatenate([np.arange(c.start, c.start + c.n, dtype=np.int32) for c in chunks])
        seq_ids = np.concatenate([np.full(c.n, c.seq.slot, dtype=np.int64) for c in chunks])
        solo = [solo_ubatches(np.arange(c.start, c.start + c.n), c.seq.n_prompt, c.seq.images, self.kv.has_swa,
                              c.seq.request.turn_starts)
                for c in chunks]
        ubatches = (np.concatenate([u[0] for u in solo]), np.concatenate([u[1] for u in solo]))
        out_rows, out_chunks, row = [], [], 0
        for c in chunks:
            row += c.n
            if c.wants_logits:
                out_rows.append(row - 1)
                out_chunks.append(c)
        n = len(tokens)

        images, spans = self._image_rows(chunks, n)
        self._share_cores()
        cells = self.kv.find_cells_for([c.seq.slot for c in chunks], [c.n for c in chunks])
        self.kv.commit(cells, seq_ids, positions, spans)
        for c in chunks:
            c.seq.n_computed += c.n

        logits = self._forward(tokens, positions, seq_ids, cells, np.asarray(out_rows, dtype=np.int32),
                               images, spans, ubatches)
        if n >= ROW_COST_MIN_ROWS:   # small steps cost more per row: they would shrink the cap
            per_row = self.last_compute_seconds / n
            self._row_seconds = per_row if not self._row_seconds else 0.8 * self._row_seconds + 0.2 * per_row
        if out_chunks:
            results = sample_batch(logits, [c.seq.sampler for c in out_chunks])
            for c, r in zip(out_chunks, results):
                events.append(self._on_token(c.seq, r))
        self.last_step_seconds = time.perf_counter() - t0
        return events

    def _encode_images(self, chunks):
        """Make sure every image row the chunks need has its embedding. Tiles encode
        on the vision worker (server/image_encoder.py) while text steps go on: a
        chunk that reaches a tile not encoded yet stops just before it, and the first
        such tile starts encoding. When no row of the step can run without a tile,
        the step encodes it (or waits for the one in flight)."""
        if self._encoder is None:
            return chunks
        asked = [(c, c.n, c.wants_logits) for c in chunks]
        while True:
            for c, n, wants_logits in asked:
                c.n, c.wants_logits = n, wants_logits
            done = self._encoder.collect()
            if done is not None:            # kept even if its request is gone
                self.images.put(*done)
                continue
            kept, missing = self._cut_at_missing_tiles(chunks)
            if missing is None:
                return kept
            if kept:
                if self._encoder.idle():    # else: one in flight, or done since the check above
                    self._encoder.start(missing.key, missing.tile)
                return kept
            done = self._encoder.collect(wait=True)     # a tile in flight: wait for it
            if done is None:                            # none: encode this one here
                done = (missing.key, self._encoder.encode_now(missing.tile))
            self.images.put(*done)

    def _share_cores(self):
        """CPU threads for this step: fewer while a tile encodes beside it."""
        want = self.n_threads
        if self._encoder is not None and self._encoder.busy():
            want = max(1, self.n_threads - BACKGROUND_THREADS)
        if want != self.backend.n_threads:
            self.backend.set_n_threads(want)

    def _cut_at_missing_tiles(self, chunks):
        """The chunks cut just before the first image tile they reach that has no
        embedding yet, and the first such tile (None: all there)."""
        kept, missing = [], None
        for c in chunks:
            end = c.start + c.n
            for span in c.seq.images:
                if span.end <= c.start or span.start >= end:
                    continue
                cached = span.key in self.images
                if span.start >= c.start and not getattr(span, "counted", False):
                    span.counted = True       # count each image of a request once
                    if cached:
                        self.images.hits += 1
                    else:
                        self.images.misses += 1
                if cached:
                    continue
                missing = missing or span
                end = span.start if span.start > c.start else c.start
                break
            if end > c.start:
                c.n = end - c.start
                c.wants_logits = end == len(c.seq.tokens)
                kept.append(c)
        return kept, missing

    def _encode(self, span):
        """Encode a span's tile now (it was evicted since it was checked)."""
        emb = self._encoder.encode_now(span.tile)
        self.images.put(span.key, emb)
        return emb

    def _image_rows(self, chunks, n):
        """The batch's image rows as (batch row, embedding buffer, first, end) blocks,
        and per-row span ids (non-zero for rows of bidirectional spans) for the KV mask."""
        rows, span_ids, row = [], np.zeros(n, dtype=np.int64), 0
        for c in chunks:
            for span in c.seq.images:
                lo, hi = max(span.start, c.start), min(span.end, c.start + c.n)
                if lo >= hi:
                    continue
                emb = self.images.get(span.key)
                if emb is None:            # evicted since it was checked: encode again
                    emb = self._encode(span)
                # the block holds its buffer: evicted later in this step, it stays alive
                rows.append((row + lo - c.start, emb, lo - span.start, hi - span.start))
                if span.bidirectional:
                    span_ids[row + lo - c.start: row + hi - c.start] = self._span_key(c.seq, span)
            row += c.n
        if not rows:
            return None, None
        return rows, span_ids

    def _span_key(self, seq, span) -> int:
        # unique per (sequence slot, image position): cells of one image occurrence
        return 1 + seq.slot * (1 << 40) + span.start

    def _forward(self, tokens, positions, seq_ids, cells, out_rows, images, spans, ubatches) -> np.ndarray:
        n = len(tokens)
        is_token = tokens >= 0
        n_tok = int(is_token.sum())
        n_out = len(out_rows)
        all_out = n_out == n
        calls = self.kv.calls_for(seq_ids, ubatches[1])
        plans = [RowPlan(kind, batched_rows(kind, positions, *ubatches), n if all_out else max(1, n_out))
                 for kind in self._kernel_kinds]
        values = {"pos": positions, **self.kv.step_values(cells, seq_ids, positions, spans, calls)}
        for plan in plans:
            values.update(plan.values())
        if n_tok:
            values["tokens"] = tokens[is_token].astype(np.int32)
        if not all_out:
            values["out_ids"] = out_rows if n_out else np.zeros(1, np.int32)
        blocks = self._image_blocks(images) if images else None
        if blocks:
            for name, _, lo, hi in blocks:
                values[name] = np.arange(lo, hi, dtype=np.int32)
            if n_tok:
                values["row_order"] = self._row_order(is_token)
        # the graph is a function of these; the values above are its inputs
        key = (n, n_tok, all_out or n_out, tuple(calls), tuple(p.key for p in plans))
        built = self._graph
        if images or built is None or built.key != key or not self.backend.holds(built.graph):
            if built is not None:
                built.graph.close()
            built = self._graph = self._build(key, n, n_tok, None if all_out else max(1, n_out), calls, plans,
                                              blocks)
            self.graph_builds += 1
        try:
            t = time.perf_counter()
            self.backend.compute(built.graph, {built.inputs[name]: arr for name, arr in values.items()})
            self.last_compute_seconds = time.perf_counter() - t
            out = built.logits.read()
        finally:
            if images:       # image steps are one of a kind: not kept
                built.graph.close()
                self._graph = None
        return out.reshape(-1, self.model.n_vocab)[:n_out]

    @staticmethod
    def _row_order(is_token) -> np.ndarray:
        """Where each batch row comes from in concat(token rows, image rows)."""
        image_row_index = np.cumsum(~is_token) - 1
        order = np.where(is_token, np.cumsum(is_token) - 1, int(is_token.sum()) + image_row_index)
        return order.astype(np.int32)

    @staticmethod
    def _image_blocks(images):
        """The batch's image blocks in batch order, with the names of their row inputs."""
        return [(f"image_rows_{i}", emb, lo, hi)
                for i, (_, emb, lo, hi) in enumerate(sorted(images, key=lambda block: block[0]))]

    @staticmethod
    def _image_embeddings(g, blocks):
        """The batch's image rows in batch order (blocks from _image_blocks), looked
        up in the stored embeddings (as weights are: a view of a tensor from another
        buffer trips ggml's allocator) and joined in the graph on the device that
        holds them."""
        rows = None
        for name, emb, lo, hi in blocks:
            block = g.get_rows(emb["embd"], g.input(name, ggml.I32, (hi - lo,)))
            rows = block if rows is None else g.concat(rows, block, 1)
        return rows

    def _build(self, key, n, n_tok, n_out, calls, plans, image_blocks) -> "BuiltGraph":
        """The forward graph for a batch of this shape (n_out None: logits for every row)."""
        g = self.backend.graph()
        try:
            t_tokens = g.input("tokens", ggml.I32, (n_tok,)) if n_tok else None
            t_pos = g.input("pos", ggml.I32, (n,))
            t_out = g.input("out_ids", ggml.I32, (n_out,)) if n_out is not None else None
            inp = ForwardInputs(t_tokens, t_pos, t_out, self.kv.declare(g, n, calls), n)
            if self.kernel_of:
                inp.kernel_of = self.kernel_of
                inp.n_outputs = n if n_out is None else n_out
                inp.plans = {p.kind: p for p in plans}
                for p in plans:
                    p.declare(g)
            if image_blocks:
                inp.images = self._image_embeddings(g, image_blocks)
                if n_tok:
                    inp.order = g.input("row_order", ggml.I32, (n,))
            logits = g.output(self.model.forward(g, inp))
        except BaseException:
            g.close()
            raise
        return BuiltGraph(key, g, {t.name: t for t in g.inputs}, logits)

    def _on_token(self, seq: Sequence, r) -> TokenEvent:
        seq.tokens.append(r.token)
        seq.n_generated += 1
        seq.sampler.accept(r.token)
        reason = None
        if self.tokenizer.is_eog(r.token) and not seq.request.ignore_eos:
            reason = "stop"
        elif seq.n_generated >= seq.request.max_tokens or len(seq.tokens) >= self.n_ctx:
            reason = "length"
        ev = TokenEvent(seq.id, r.token, r.logprob, r.top, reason, seq.n_prompt, seq.n_cached)
        if reason is not None:
            self.scheduler.remove(seq.id)
            self._release(seq, keep=True)
        return ev

    def _finish(self, seq: Sequence, token, reason) -> TokenEvent:
        self.scheduler.remove(seq.id)
        self._release(seq, keep=True)
        return TokenEvent(seq.id, token, None, [], reason, seq.n_prompt, seq.n_cached)


class BuiltGraph:
    """A forward graph kept between steps: decode steps of the same shape (same
    batch rows, attention calls and matmul row plans) only refill its inputs, as
    llama.cpp reuses its graph, skipping the Python build and ggml's allocation."""

    def __init__(self, key, graph, inputs: dict, logits):
        self.key = key
        self.graph = graph
        self.inputs = inputs       # input name -> tensor
        self.logits = logits


class ImageStore:
    """Image embeddings by content key (sha256 of the image + tile), least recently
    used first out when over the byte budget. An image is encoded once; later
    chunks and later requests take its rows from here. Each is a ggml Buffer on the
    device of the first text layer; an evicted one is freed once no step uses it."""

    def __init__(self, max_bytes: int):
        import collections

        self.max_bytes = max_bytes
        self._items = collections.OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.encoded = 0

    def __contains__(self, key) -> bool:
        if key in self._items:
            self._items.move_to_end(key)
            return True
        return False

    def get(self, key) -> ggml.Buffer | None:
        return self._items.get(key)

    def put(self, key, emb: ggml.Buffer) -> None:
        self.encoded += 1
        self._items[key] = emb
        self.nbytes += emb.nbytes
        while self.nbytes > self.max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.nbytes -= old.nbytes
