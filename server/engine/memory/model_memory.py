"""A model's memory: the KV cache for its attention layers and, for hybrid models,
a recurrent state per sequence for its recurrent layers. Built from the specs the
model declares (models/memory.py); the prefix cache and the engine change it only
through the operations here, so both kinds stay in step.
"""
from __future__ import annotations

import numpy as np

from ggserve.models.memory import LayerKV, LayerRecurrent
from ggserve.server.engine.memory.kv_cache import KVCache
from ggserve.server.engine.memory.recurrent_state import CTX_CHECKPOINTS, Checkpoints, RecurrentState
from ggserve.server.engine.memory.swa_ring import SplitStep, SwaRing, ring_size

CHECKPOINT_TAIL = 4     # ref: llama.cpp tools/server/server-context.cpp, checkpoint_offsets
N_CTX_PAD = 256         # llama.cpp pads context sizes to a multiple of this (llama-context.cpp)


def _pad(n: int) -> int:
    return -(-n // N_CTX_PAD) * N_CTX_PAD


def context_sizes(n_ctx: int, n_parallel: int, unified: bool, n_ctx_train: int) -> tuple[int, int]:
    """(KV cells, context per slot) as llama.cpp 11434 sizes them: n_ctx 0 is the
    model's training context; the total is padded to 256; a unified cache lets any
    slot use all of it, otherwise each slot gets its share padded to 256 (and the
    total grows to match); a slot never gets more than the training context
    (llama-server's n_ctx_slot)."""
    n = n_ctx or n_ctx_train
    if n <= 0:
        raise ValueError("-c 0 asks for the model's training context, which this GGUF does not give "
                         "(<arch>.context_length): pass -c N")
    n = _pad(n)
    per_slot = n if unified else _pad(n // n_parallel)
    if not unified:
        n = per_slot * n_parallel
    return n, min(per_slot, n_ctx_train) if n_ctx_train > 0 else per_slot


def ring_layout(specs: list, kv_size: int, n_seqs: int, n_ubatch: int, unified: bool) -> tuple[int, int]:
    """(cells per ring, rings) of the window_cache layers: one ring every sequence
    shares with a unified cache, else one per sequence (llama.cpp's per-stream caches)."""
    window, n = max(s.sliding_window for s in specs if s is not None and s.window_cache), max(1, n_seqs)
    if unified:
        return ring_size(window, n_ubatch, kv_size, n), 1
    return ring_size(window, n_ubatch, kv_size // n), n


class Memory:
    def __init__(self, backend, specs: list, *, kv_size: int, n_seqs: int, type_k, type_v, n_pos: int = 1,
                 n_ubatch: int = 512, unified: bool = False, checkpoints: Checkpoints | int = CTX_CHECKPOINTS):
        self.backend = backend
        attention = [s if isinstance(s, LayerKV) else None for s in specs]
        recurrent = [s if isinstance(s, LayerRecurrent) else None for s in specs]
        # window_cache layers keep their K/V in a ring of their own (swa_ring.py)
        self.in_ring = [s is not None and s.window_cache for s in attention]
        self.swa = None
        if any(self.in_ring):
            ring = [s if r else None for s, r in zip(attention, self.in_ring)]
            self.swa = SwaRing(backend, ring, *ring_layout(ring, kv_size, n_seqs, n_ubatch, unified), type_k, type_v)
            attention = [None if r else s for s, r in zip(attention, self.in_ring)]
        self.n_ubatch = n_ubatch
        self._ring_cells = np.zeros(0, dtype=np.int64)
        # every model keeps a KV cache (it also records which tokens each sequence
        # holds); layers without attention get no K/V storage in it
        self.kv = KVCache(backend, attention, kv_size, type_k, type_v, n_regions=n_seqs, n_pos=n_pos)
        self.kv.has_swa |= self.swa is not None
        # --ctx-checkpoints alone (an int), or with --checkpoint-min-step
        n, min_step = checkpoints if isinstance(checkpoints, tuple) else Checkpoints(checkpoints)
        self.recurrent = RecurrentState(backend, recurrent, n_seqs, n, min_step) if any(recurrent) else None

    def close(self) -> None:
        self.kv.close()
        if self.swa is not None:
            self.swa.close()
        if self.recurrent is not None:
            self.recurrent.close()

    @property
    def n_used(self) -> int:
        return self.kv.n_used

    def nbytes_by_device(self) -> dict:
        out = dict(self.kv.nbytes_by_device())
        for name, n in (self.swa.nbytes_by_device() if self.swa is not None else {}).items():
            out[name] = out.get(name, 0) + n
        if self.recurrent is not None:
            for name, n in self.recurrent.nbytes_by_device().items():
                out[name] = out.get(name, 0) + n
        return out

    # -- sequences -------------------------------------------------------------------

    @property
    def cuts_anywhere(self) -> bool:
        """Can a sequence's memory be cut after any of its tokens? Not with a
        recurrent state, which holds only where the sequence is and where it was
        saved."""
        return self.recurrent is None

    def state_points(self, n_prompt: int, turn_starts=()) -> tuple[int, ...]:
        """Where a prompt's recurrent state is saved on its way (a prompt chunk ends
        there): as llama-server's context checkpoints, CHECKPOINT_TAIL tokens before
        the prompt's end (the next turn of a chat continues the prompt up to the
        assistant's opening) and at user turns (a conversation sharing the system
        prompt). () without recurrent layers or with checkpoints off (--ctx-checkpoints 0)."""
        if self.recurrent is None or not self.recurrent.max_snapshots:
            return ()
        return tuple(sorted({p for p in (n_prompt - CHECKPOINT_TAIL, *turn_starts) if 0 < p < n_prompt}))

    def reusable(self, seq: int, n: int) -> int:
        """How many of n cached tokens seq can keep (or give to another sequence):
        all of them, or with a recurrent state, as many as it has a state for."""
        if self.swa is not None and not self.swa.holds_window(seq, n):
            return 0        # the ring lost positions the next token's window shows: computed again
        return n if self.recurrent is None else self.recurrent.reusable(seq, n)

    def keep(self, seq: int, n: int, pos: int) -> None:
        """seq keeps its first n tokens (n from `reusable`), those before position pos,
        and drops the rest."""
        self.kv.seq_rm(seq, pos)
        if self.swa is not None:
            self.swa.seq_rm(seq, pos)
        if self.recurrent is not None:
            if n == 0:
                self.recurrent.alloc(seq)
            else:
                self.recurrent.keep(seq, n)

    def take_prefix(self, src: int, dst: int, n: int, pos: int) -> bool:
        """dst drops what it holds and gets src's first n tokens (n > 0, those before
        position pos); False (nothing changed) when src has no recurrent state there."""
        if n <= 0 or self.reusable(src, n) != n:
            return False
        if self.swa is not None and not self.swa.copy_prefix(self.backend, src, dst, pos):
            return False
        self.kv.seq_rm(dst)
        if self.recurrent is not None:
            self.recurrent.copy(src, dst, n)
        if not self.kv.seq_copy(self.backend, src, dst, pos):
            self.kv.seq_cp(src, dst, 0, pos)     # no room to copy (or not one cell per position): share
        return True

    @property
    def can_shift(self) -> bool:
        """Can positions move? Not in a sliding-window ring smaller than the cache: llama.cpp's
        iSWA cache shifts only when both caches have one size (llama-kv-cache-iswa.cpp
        get_can_shift; --swa-full), and llama-server then turns --context-shift off."""
        return self.recurrent is None and (self.swa is None or self.swa.size == self.kv.size)

    def context_shift(self, seq: int, n_keep: int, n_discard: int, n_past: int, model) -> bool:
        """seq drops its tokens n_keep .. n_keep + n_discard and the n_past - n_keep -
        n_discard after them move back to follow the kept ones, keys re-rotated
        (llama-server's context shift: seq_rm, seq_add). False (nothing done) where
        memory cannot: a recurrent state, M-RoPE, a ring (can_shift), or cells shared
        with another sequence."""
        if self.recurrent is not None or not self.can_shift or not self.kv.owns(seq, n_keep):
            return False
        for cache in (self.kv, self.swa) if self.swa is not None else (self.kv,):
            cache.seq_rm(seq, n_keep, n_keep + n_discard)
            cache.seq_add(self.backend, model, seq, n_keep + n_discard, n_past, -n_discard)
        return True

    def free(self, seq: int) -> None:
        self.kv.seq_rm(seq)
        if self.swa is not None:
            self.swa.seq_rm(seq)
        if self.recurrent is not None:
            self.recurrent.free(seq)

    def clear(self) -> None:
        self.kv.clear()
        if self.swa is not None:
            self.swa.clear()
        if self.recurrent is not None:
            for s in range(self.recurrent.n_seqs):
                self.recurrent.free(s)

    # -- steps -----------------------------------------------------------------------

    def begin_step(self, seqs: list[int], counts: list[int], seq_ids, positions, spans) -> np.ndarray:
        """Place and record the step's tokens (masks are built from them). -> the cells.
        (The step writes new recurrent states beside the live ones: see end_step.)"""
        cells = self.kv.find_cells_for(seqs, counts)
        self.kv.commit(cells, seq_ids, positions, spans)
        if self.swa is not None:      # each sequence's rows ubatch by ubatch, as llama.cpp places them
            first = np.asarray(positions).reshape(-1, len(cells))[0]
            ring = np.zeros(len(cells), dtype=np.int64)
            self.swa.begin_step()
            for seq in dict.fromkeys(np.asarray(seq_ids).tolist()):
                rows = np.flatnonzero(np.asarray(seq_ids) == seq)
                for a in range(0, len(rows), self.n_ubatch):
                    part = rows[a:a + self.n_ubatch]
                    ring[part] = self.swa.place(seq, first[part], None if spans is None else spans[part])
            self._ring_cells = ring
        return cells

    def ring_cells(self) -> np.ndarray:
        """The ring cells of the last step's rows (begin_step), in row order."""
        return self._ring_cells

    def declare(self, g, n_tokens: int, calls, ring_calls=None):
        """The step's AttentionStep: the main cache's, split with the ring's when there is one."""
        main = self.kv.declare(g, n_tokens, calls)
        if self.swa is None:
            return main
        return SplitStep(main, self.swa.declare(g, n_tokens, ring_calls), self.in_ring)

    def end_step(self, seqs: list[int], counts: list[int], save=()) -> None:
        """The step succeeded: the recurrent states it wrote become the live ones, and
        those of the sequences in `save` (at one of their state points) are saved."""
        if self.recurrent is not None:
            self.recurrent.advance(seqs, counts)
            self.recurrent.snapshot(save)

    def drop(self, cells: np.ndarray) -> None:
        """Cells a step wrote that its sequence does not keep (rejected drafted tokens,
        the last of their sequence's cells) are free again. Only without recurrent
        state, which cannot be cut back (cuts_anywhere)."""
        if self.swa is not None:      # the same tokens' ring cells (one sequence per cell)
            for c in cells.tolist():
                seq = int(self.kv.seqs[c]).bit_length() - 1
                if seq >= 0:
                    self.swa.seq_rm(seq, int(self.kv.pos[c]), int(self.kv.pos[c]) + 1)
        self.kv.rollback(cells)

    def undo_step(self, cells: np.ndarray, seqs: list[int]) -> None:
        """The step failed: its cells are free and each state is as before it (the
        live state was only read)."""
        if self.swa is not None:
            self.swa.rollback(self._ring_cells)
        self.kv.rollback(cells)
