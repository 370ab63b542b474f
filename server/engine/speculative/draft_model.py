"""A draft model for speculative decoding (`-md`, llama.cpp's draft-simple): a
second, smaller model with the same vocabulary proposes each decoding sequence's
next tokens greedily; the target verifies them (server/engine/speculative/speculator.py).

It keeps its own KV cache, one region per slot of the target, holding a prefix of
that slot's tokens: before drafting, each sequence's region is cut back to what
it shares with the target's tokens (rejected drafts, or another request in the
slot) and the rest is fed (a new prompt: in n_batch-row steps). Then all
sequences draft together, one row each per step, until each has its k tokens or
its best token's probability falls under p_min. Its numbers need no parity with
llama.cpp: a draft only decides how many rows a step verifies, never a token.
"""
from __future__ import annotations

import logging

import numpy as np

from ggserve.native import ggml
from ggserve.server.engine.batch import assemble
from ggserve.server.engine.graph_runner import GraphRunner
from ggserve.server.engine.kernel_parity import KernelParity
from ggserve.server.engine.loader import LoadedModel
from ggserve.server.engine.memory.model_memory import Memory
from ggserve.server.engine.memory.prefix_cache import common_prefix
from ggserve.server.engine.scheduler import Chunk

log = logging.getLogger("ggserve.draft")

VOCAB_MAX_DIFFERENCE = 128    # ref: llama.cpp common/speculative.cpp, SPEC_VOCAB_MAX_SIZE_DIFFERENCE


class _Shadow:
    """What the draft model holds for one slot (the fields batch.assemble reads)."""
    pool = None
    images = ()

    def __init__(self, slot: int):
        self.slot = slot
        self.tokens: list[int] = []
        self.n_computed = 0
        self.salt = ""           # the cache salt of the sequence it drafted for (Request.cache_salt)


class DraftModel:
    def __init__(self, path: str, target_tokenizer, *, n_ctx: int, n_batch: int, n_parallel: int,
                 n_threads: int, n_gpu_layers: int = 0):
        self.loaded = lm = LoadedModel(path, n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_parallel=n_parallel)
        try:
            _check_vocab(lm.tokenizer, target_tokenizer)
            if getattr(lm.model, "n_pos", 1) != 1 or lm.vision is not None:
                raise ValueError("a draft model must be a text model with one position per token")
            self.memory = Memory(lm.backend, lm.model.memory_layers(lm.device_of_layer), kv_size=n_ctx,
                                 n_seqs=n_parallel, type_k=ggml.F16, type_v=ggml.F16)
            if self.memory.recurrent is not None:
                raise ValueError("a draft model with recurrent layers cannot drop rejected tokens")
            self.runner = GraphRunner(lm.backend, lm.model, self.memory, KernelParity(False, {}, False), 1)
            self.runner.reserve(n_batch, n_parallel)
        except BaseException:
            lm.close()
            raise
        self.n_batch, self.n_threads = n_batch, lm.backend.n_threads
        self.n_vocab = min(lm.tokenizer.n_vocab, target_tokenizer.n_vocab)
        self.shadows = [_Shadow(s) for s in range(n_parallel)]

    def propose(self, seqs: list, room: dict, p_min: float) -> dict:
        """seq -> up to room[seq] drafted tokens, for the target's decoding sequences."""
        active = []
        for s in seqs:
            sh = self.shadows[s.slot]
            keep = min(common_prefix(sh.tokens[:sh.n_computed], s.tokens), len(s.tokens) - 1)
            keep = keep if sh.salt == s.request.cache_salt else 0     # nothing across cache salts
            self.memory.kv.seq_rm(s.slot, keep)
            sh.tokens, sh.n_computed, sh.salt = list(s.tokens), keep, s.request.cache_salt
            active.append(sh)
        drafts = {sh.slot: [] for sh in active}
        want = {s.slot: room[s] for s in seqs}
        try:
            while active:
                for sh, row in self._step(active):
                    tok = int(np.argmax(row[:self.n_vocab]))
                    if p_min > 0 and _top_prob(row, tok) < p_min:
                        active.remove(sh)
                        continue
                    sh.tokens.append(tok)
                    drafts[sh.slot].append(tok)
                    if len(drafts[sh.slot]) >= want[sh.slot]:
                        active.remove(sh)
        except Exception:            # no draft this step; the target decodes as usual
            log.exception("the draft model failed")
            for sh in self.shadows:
                self.memory.free(sh.slot)
                sh.tokens, sh.n_computed = [], 0
            return {}
        return {s: drafts[s.slot] for s in seqs}

    def _step(self, active: list) -> list:
        """Feed each active shadow's pending tokens (within n_batch); -> (shadow,
        logits row) for those whose tokens are all fed."""
        chunks, budget = [], self.n_batch
        for sh in active:
            n = min(len(sh.tokens) - sh.n_computed, budget)
            if n > 0:
                chunks.append(Chunk(sh, sh.n_computed, n, sh.n_computed + n == len(sh.tokens)))
                budget -= n
        batch = assemble(chunks, None, 1)
        seqs, counts = batch.per_sequence()
        cells = self.memory.begin_step(seqs, counts, batch.seq_ids, batch.positions, None)
        try:
            logits = self.runner.run(batch, cells, self.n_threads)
        except BaseException:
            self.memory.undo_step(cells, seqs)
            raise
        self.memory.end_step(seqs, counts)
        for c in chunks:
            c.seq.n_computed += c.n
        return [(c.seq, row) for c, row in zip(batch.out_chunks, logits)]

    def close(self) -> None:
        self.runner.close()
        self.memory.close()
        self.loaded.close()


def _top_prob(row: np.ndarray, tok: int) -> float:
    z = np.exp(row.astype(np.float64) - float(row[tok]))
    return float(1.0 / z.sum())


def _check_vocab(draft, target) -> None:
    """As llama.cpp's common_speculative_are_compatible: the same special tokens, and
    the same token texts over vocabularies that differ by at most 128 entries."""
    if abs(draft.n_vocab - target.n_vocab) > VOCAB_MAX_DIFFERENCE:
        raise ValueError(f"the draft model's vocabulary ({draft.n_vocab} tokens) differs from the target's "
                         f"({target.n_vocab}) by more than {VOCAB_MAX_DIFFERENCE}")
    if draft.bos_id != target.bos_id or draft.eos_id != target.eos_id:
        raise ValueError("the draft model's BOS/EOS tokens differ from the target's")
    n = min(draft.n_vocab, target.n_vocab)
    bad = next((i for i in range(n) if draft.vocab.tokens[i] != target.vocab.tokens[i]), None)
    if bad is not None:
        raise ValueError(f"the draft model's token {bad} ({draft.vocab.tokens[bad]!r}) differs from the "
                         f"target's ({target.vocab.tokens[bad]!r})")
