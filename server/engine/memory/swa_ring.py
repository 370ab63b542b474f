"""Sliding-window layers in cells of their own, as llama.cpp's iSWA cache keeps them.

llama.cpp 11434 (src/llama-kv-cache-iswa.cpp) gives a model's sliding-window layers a
second KV cache of pad(n_swa + n_ubatch, 256) cells (768 for a window of 32 and 512-row
ubatches, `load_summary.json`), used as a ring: a ubatch's tokens go, from the cache's
head on, into empty cells or cells whose position the window already hides from the
sequence's last token (llama-kv-cache.cpp find_slot: is_masked_swa(pos_cell,
seq_pos_max + 1)); positions below the highest one overwritten are then dropped
(apply_ubatch), and attention runs over the first pad(used, 256) cells. Past the
ring's size a sequence's cells wrap around, so flash attention visits the same keys
in another order and over another number of cells than in one long cache: on a
model as sensitive as EXAONE 4's 64 layers that changes the logits (long_code's
1231-token prompt). `SwaRing` places cells as llama.cpp does, one ring per sequence
(region), so a sequence gets its solo result whatever runs beside it. With a unified
cache llama.cpp keeps one ring of pad(n_seqs x window + ubatch) cells that every
sequence places in (a cell is usable once the window hides it from its own
sequence's last token): `SwaRing` with one region does the same.
"""
from __future__ import annotations

import numpy as np

from ggserve.native import ggml
from ggserve.server.engine.memory.kv_cache import N_KV_PAD, KVCache, KVCacheFull
from ggserve.server.engine.memory.kv_step import KVStep, mask_name

TAG = "_swa"        # graph inputs of the ring: kv_slots_swa, kq_mask_w32_c0_swa


def ring_size(window: int, n_ubatch: int, per_slot: int, n_seqs: int = 1) -> int:
    """Cells of a ring that n_seqs sequences share (1: one sequence's ring), at most
    per_slot (llama-kv-cache-iswa.cpp: size_swa, n_swa x n_seq_max with a unified cache)."""
    return min(per_slot, -(-(window * n_seqs + n_ubatch) // N_KV_PAD) * N_KV_PAD)


class SwaRing(KVCache):
    """K/V of the `window_cache` layers; the main cache keeps the rest and the
    bookkeeping of which tokens each sequence holds."""

    def __init__(self, backend, layers, size_per_region: int, n_regions: int, type_k, type_v):
        super().__init__(backend, layers, size_per_region * n_regions, type_k, type_v, n_regions=n_regions)
        self.window = max(l.sliding_window for l in layers if l is not None)
        self.head = np.zeros(n_regions, dtype=np.int64)       # per region, relative to its start
        self._before: dict[int, int] = {}      # each sequence's last position before this step

    def begin_step(self) -> None:
        """A step's placements start: another sequence's cells stay until the step has
        read them (as llama.cpp places a whole ubatch against the cache before it)."""
        owners = self.seqs[self.seqs != 0]
        self._before = {b.bit_length() - 1: int(self.pos[self._cells_of(b.bit_length() - 1)].max())
                        for b in np.unique(owners).tolist() if not b & (b - 1)}

    def _masked(self, cells: np.ndarray, seq: int) -> np.ndarray:
        """Cells the window hides from the last token of the one sequence that holds them
        (seq's own: as placed so far; another's: as it was before the step)."""
        out = np.zeros(len(cells), dtype=bool)
        owners = self.seqs[cells]
        for bits in np.unique(owners[owners != 0]).tolist():
            if bits & (bits - 1):
                continue          # shared by several sequences: kept
            s = bits.bit_length() - 1
            pmax = int(self.pos[self._cells_of(s)].max()) if s == seq else self._before.get(s, -1)
            sel = owners == bits
            out[sel] = self.pos[cells[sel]] <= pmax + 1 - self.window
        return out

    def place(self, seq: int, positions: np.ndarray, spans: np.ndarray | None = None) -> np.ndarray:
        """Find and take cells for seq's tokens at these positions (one ubatch; spans: their
        bidirectional span ids, an image's rows seeing each other), llama.cpp's find_slot then
        apply_ubatch. Raises KVCacheFull."""
        r0, r1 = self._region(seq)
        size, n = r1 - r0, len(positions)
        used = int(np.count_nonzero(self.seqs[r0:r1]))
        head = int(self.head[seq % self.n_regions])
        if head > used + 2 * n:
            head = 0
        order = (np.arange(size) + head) % size + r0
        usable = (self.seqs[order] == 0) | self._masked(order, seq)
        picked = order[usable][:n]
        if len(picked) < n:
            raise KVCacheFull(f"need {n} sliding-window cells, {len(picked)} usable")
        taken = picked[self.seqs[picked] != 0]
        overwritten = {}          # owner -> the highest position overwritten
        for owner, p in zip(self.seqs[taken].tolist(), self.pos[taken].tolist()):
            s = owner.bit_length() - 1
            overwritten[s] = max(overwritten.get(s, -1), p)
        self.seqs[picked] = 0
        self.pos[picked] = -1
        self.commit(picked, np.full(n, seq), positions, spans)
        for s, p in overwritten.items():     # keep [pos_min, pos_max] whole: drop what lies below an overwritten one
            self.seq_rm(s, 0, p + 1)
        self.head[seq % self.n_regions] = int(picked[-1]) - r0 + 1
        return picked

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> None:
        r0, _ = self._region(seq)
        before = self.seqs != 0
        super().seq_rm(seq, p0, p1)
        freed = np.flatnonzero(before & (self.seqs == 0))
        freed = freed[freed >= r0]
        if len(freed):            # llama.cpp: the search starts again at the first freed cell
            i = seq % self.n_regions
            self.head[i] = min(int(self.head[i]), int(freed[0]) - r0)

    def clear(self) -> None:
        super().clear()
        self.head[:] = 0

    def restore(self, seq: int, positions: np.ndarray, spans: np.ndarray, upto: int) -> tuple[np.ndarray, np.ndarray]:
        """seq (holding no cells) takes cells for saved ones, given in the order the saved
        cells lay in the ring: llama.cpp's state_read places them with one find_slot from
        the head, so a ring saved whole comes back in the cells it was computed in. Where
        too few cells are usable for all (a ring the slots share), only those the window
        shows the token at `upto` (positions upto - window .. upto - 1). -> (the cells,
        which of the saved ones they hold). Raises KVCacheFull."""
        self.begin_step()
        try:
            return self.place(seq, positions, spans), np.arange(len(positions))
        except KVCacheFull:
            keep = np.flatnonzero((positions >= upto - self.window) & (positions < upto))
            return self.place(seq, positions[keep], spans[keep]), keep

    def copy_prefix(self, backend, src: int, dst: int, p1: int) -> bool:
        """dst drops its cells and gets its own copy of src's with pos < p1, placed as
        restore places them (one graph reads src's rows before any is written, so dst may
        take cells the window hides from src); False (nothing changed) without room."""
        cells = self._cells_of(src)
        cells = cells[self.pos[cells] < p1]
        before = self.pos.copy(), self.seqs.copy(), self.span.copy(), self.head.copy()
        self.seq_rm(dst)
        try:
            dst_cells, keep = self.restore(dst, self.pos[cells].copy(), self.span[cells].copy(), p1)
        except KVCacheFull:
            self.pos[:], self.seqs[:], self.span[:], self.head[:] = before
            self._extent.clear()
            return False
        self.copy_rows(backend, cells[keep], dst_cells)
        return True

    def holds_window(self, seq: int, n: int) -> bool:
        """Can seq keep its first n tokens here: are the positions the window shows the
        next token (n - window .. n - 1) still in the ring? (llama-server's pos_min check)"""
        mine = self._cells_of(seq)
        if n <= 0 or not len(mine):
            return n <= 0
        return int(self.pos[mine].min()) <= max(0, n - self.window)

    def view_for(self, seq: int, upto: int | None = None) -> tuple[int, int]:
        """llama.cpp's n_kv: from the ring's first cell, its used cells padded to 256
        (used_max_p1). With `upto`, as the step of that cell's row alone saw it: the
        cells holding that row's position or an earlier one; in a wrapped ring these
        reach past the row's own cell."""
        r0, r1 = self._region(seq)
        mine = self._cells_of(seq)
        last = int(mine[-1]) if upto is None else max(upto, int(mine[self.pos[mine] <= self.pos[upto]].max()))
        return r0, r0 + min(r1 - r0, max(N_KV_PAD, -(-(last + 1 - r0) // N_KV_PAD) * N_KV_PAD))

    def step_values(self, cells, seq_ids, positions, spans, calls) -> dict[str, np.ndarray]:
        values = super().step_values(cells, seq_ids, positions, spans, calls)
        return {(k + TAG if k == "kv_slots" or k.startswith("kq_mask") else k): v for k, v in values.items()}

    def declare(self, g, n_tokens: int, calls) -> KVStep:
        return RingStep(self, calls).declare(g, n_tokens)


class RingStep(KVStep):
    def declare(self, g, n_tokens: int) -> RingStep:
        n_mask = sum(rows * (c1 - c0) for _, _, c0, c1, rows in self.calls)
        self.slots = g.input("kv_slots" + TAG, ggml.I64, (n_tokens,))
        self.masks = {kind: g.input(mask_name(*kind) + TAG, ggml.F16, (n_mask,)) for kind in self.cache.mask_kinds}
        self._g = g
        return self


class SplitStep:
    """A step's attention with the window_cache layers in the ring, the others in the
    main cache (models see one AttentionStep)."""

    def __init__(self, main: KVStep, ring: KVStep, in_ring: list[bool]):
        self.main, self.ring, self.in_ring = main, ring, in_ring
        ring._rot = main._rot     # one Hadamard input per size in the graph

    def attention(self, g, il: int, q, k, v, scale: float, softcap: float = 0.0, sinks=None):
        step = self.ring if self.in_ring[il] else self.main
        return step.attention(g, il, q, k, v, scale, softcap, sinks)
