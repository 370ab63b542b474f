"""The KV cache: cells with positions and sequence sets, K/V storage in ggml buffers.

One unified cache holds every sequence. Each cell has a position and a set of
sequences (a bitmask: a prefix shared by several sequences is stored once). The
cache plans placement for a whole batch before touching anything, builds the
attention masks (causal, per-sequence, sliding window, bidirectional spans) and
runs attention for the models, so models never see cell indices.
"""
from __future__ import annotations

import numpy as np

from ggserve.models.memory import LayerKV
from ggserve.native import ggml
from ggserve.server.engine.memory.kv_step import KVStep, mask_name, rotation_values, shift_keys

__all__ = ["KVCache", "KVCacheFull", "LayerKV", "KVStep"]

MAX_SEQS = 64          # sequences are bits of a uint64
N_KV_PAD = 256         # attend over a multiple of 256 cells, as llama.cpp does

_NEG_INF = np.float16(-np.inf)


class KVCacheFull(RuntimeError):
    pass


class KVCache:
    def __init__(self, backend, layers: list[LayerKV | None], size: int,
                 type_k=ggml.F16, type_v=ggml.F16, n_regions: int = 1, n_pos: int = 1):
        self.size = size
        self.n_pos = n_pos
        # sequence s fills cells of region s % n_regions first (one per slot), so a
        # sequence's cells are contiguous and start where they would if it ran alone
        self.region = max(1, size // max(1, n_regions))
        self.n_regions = max(1, n_regions)
        self.layers = layers
        self.type_k = type_k
        self.type_v = type_v
        # a cell's position: the first of its token's n_pos positions decides masks
        # (causality, window); the others (M-RoPE's) are kept beside it
        self.pos = np.full(size, -1, dtype=np.int32)
        self.pos_ext = np.zeros((n_pos - 1, size), dtype=np.int32)
        self.seqs = np.zeros(size, dtype=np.uint64)
        # span id per cell: cells of one bidirectional span (an image) see each other
        self.span = np.zeros(size, dtype=np.int64)
        # (first cell, last cell) per sequence, kept up to date by commit, dropped by
        # other changes: every step asks for them, a scan of the cache costs more
        self._extent: dict[int, tuple[int, int]] = {}
        # sequences with free cells below their last one (a context shift dropped
        # some): their next tokens fill those first, as llama.cpp's search from head
        self._refill: set[int] = set()
        self.buffers = []
        self.k, self.v = [], []
        by_device = {}
        for il, layer in enumerate(layers):     # None: a layer without attention (hybrid models)
            if layer is None or layer.kv_from >= 0:     # kv_from: reads another layer's K/V
                continue
            by_device.setdefault(layer.device, []).append(il)
        tensors = {}
        for device, ils in by_device.items():
            specs = []
            for il in ils:
                specs.append((f"cache_k_l{il}", type_k, (layers[il].n_embd_k, size)))
                if not layers[il].v_in_k:
                    specs.append((f"cache_v_l{il}", type_v, (layers[il].n_embd_v, size)))
            buf = backend.alloc(device, specs)
            self.buffers.append(buf)
            tensors.update(buf.tensors)
        self.k = [tensors.get(f"cache_k_l{il}") for il in range(len(layers))]
        self.v = [tensors.get(f"cache_v_l{il}") for il in range(len(layers))]
        # one mask per kind of layer: (sliding window, chunk), (0, 0) for global layers
        self.mask_kinds = sorted({l.mask_kind for l in layers if l is not None})
        self.has_swa = any(kind != (0, 0) for kind in self.mask_kinds)

    def close(self):
        for b in self.buffers:
            b.close()
        self.buffers = []

    # -- bookkeeping -------------------------------------------------------------

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.seqs))

    @property
    def n_free(self) -> int:
        return self.size - self.n_used

    def nbytes_by_device(self) -> dict:
        out = {}
        for b in self.buffers:
            out[b.device.name] = out.get(b.device.name, 0) + b.nbytes
        return out

    def _region(self, seq: int) -> tuple[int, int]:
        """[r0, r1): the cells seq fills first (the last region takes the remainder)."""
        i = seq % self.n_regions
        r0 = i * self.region
        return r0, (self.size if i == self.n_regions - 1 else r0 + self.region)

    def _cells_of(self, seq: int) -> np.ndarray:
        """Indices of the cells seq holds, ascending."""
        return np.flatnonzero((self.seqs & (np.uint64(1) << np.uint64(seq))) != 0)

    def _extent_of(self, seq: int) -> tuple[int, int] | None:
        """(first, last) cell seq holds; None when it holds none."""
        ext = self._extent.get(seq)
        if ext is None:
            mine = self._cells_of(seq)
            if not len(mine):
                return None
            ext = self._extent[seq] = (int(mine[0]), int(mine[-1]))
        return ext

    def find_cells_for(self, seqs: list[int], counts: list[int]) -> np.ndarray:
        """Plan cells for a batch made of `counts[i]` new tokens of sequence `seqs[i]`.

        Why: attention results depend on where a sequence's cells lie (flash attention
        visits cells in index order, and its tiled and split kernels group them by
        index), so a sequence gets the cells it would get running alone: free cells
        above its last cell (a shared prefix may lie in another slot's region), in its
        own region first, then anywhere above; only when none is left above, any
        free cell. No mutation.
        """
        # usual case (decodes, prompt chunks): the cells right above each sequence's
        # last one, in its own region, are free, so they are the first free ones
        blocks = []
        for seq, n in zip(seqs, counts):
            r0, r1 = self._region(seq)
            ext = self._extent_of(seq)
            start = max(r0, ext[1] + 1 if ext else 0)
            if start + n > r1 or self.seqs[start:start + n].any() or seq in self._refill:
                return self._find_cells_scanning(seqs, counts)
            blocks.append((start, start + n))
        ordered = sorted(b for b in blocks if b[1] > b[0])
        if any(b[0] < a[1] for a, b in zip(ordered, ordered[1:])):
            return self._find_cells_scanning(seqs, counts)
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in blocks]) if blocks \
            else np.zeros(0, dtype=np.int64)

    def _find_cells_scanning(self, seqs: list[int], counts: list[int]) -> np.ndarray:
        free = self.seqs == 0
        if int(free.sum()) < sum(counts):
            raise KVCacheFull(f"need {sum(counts)} KV cells, {int(free.sum())} free")
        out = []
        for seq, n in zip(seqs, counts):
            r0, r1 = self._region(seq)
            ext = self._extent_of(seq)
            above = ext[1] + 1 if ext else 0
            cells = np.zeros(0, dtype=np.int64)
            ranges = ((max(r0, above), r1), (above, self.size), (0, self.size))
            if seq in self._refill and ext:
                # after a context shift llama.cpp searches from the cache's first free cell
                # (seq_add resets its head to 0): the freed cells, from the region's start
                lo = min(r0, ext[0])
                ranges = ((lo, above),) + ranges
                if not free[lo:above].any():
                    self._refill.discard(seq)
            for lo, hi in ranges:
                if len(cells) >= n or lo >= hi:
                    continue
                more = np.flatnonzero(free[lo:hi]) + lo
                more = more[~np.isin(more, cells)]
                cells = np.concatenate([cells, more[: n - len(cells)]])
            cells = np.sort(cells)
            free[cells] = False
            out.append(cells)
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def commit(self, cells: np.ndarray, seq_ids: np.ndarray, positions: np.ndarray,
               spans: np.ndarray | None = None) -> None:
        """Apply a plan: cells now hold these sequences' tokens at these positions
        ([n_tokens], or [n_pos, n_tokens])."""
        positions = positions.reshape(-1, len(cells))
        self.pos[cells] = positions[0]
        if self.n_pos > 1:
            self.pos_ext[:, cells] = positions[1:]
        self.seqs[cells] = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))
        for seq in set(seq_ids.tolist()) & self._extent.keys():
            ext = self._extent[seq]
            mine = cells[seq_ids == seq]
            self._extent[seq] = (min(ext[0], int(mine.min())), max(ext[1], int(mine.max())))
        self.span[cells] = 0 if spans is None else spans

    def rollback(self, cells: np.ndarray) -> None:
        """Undo a commit whose step failed: the cells are free again."""
        self.seqs[cells] = 0
        self.pos[cells] = -1
        self.span[cells] = 0
        self._extent.clear()

    def positions_of(self, cells: np.ndarray) -> np.ndarray:
        """[n_pos, len(cells)]: the positions the cells hold."""
        return np.concatenate([self.pos[None, cells], self.pos_ext[:, cells]])

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> None:
        """Remove seq from cells with p0 <= pos < p1 (p1 None: to the end)."""
        bit = np.uint64(1) << np.uint64(seq)
        sel = (self.seqs & bit) != 0
        sel &= self.pos >= p0
        if p1 is not None:
            sel &= self.pos < p1
        self.seqs[sel] &= ~bit
        self._extent.clear()
        self.pos[self.seqs == 0] = -1

    def owns(self, seq: int, p0: int) -> bool:
        """Are seq's cells from position p0 on its own (no other sequence shares them)?"""
        bit = np.uint64(1) << np.uint64(seq)
        sel = ((self.seqs & bit) != 0) & (self.pos >= p0)
        return self.n_pos == 1 and bool((self.seqs[sel] == bit).all())

    def seq_add(self, backend, model, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move seq's cells with p0 <= pos < p1 (cells it owns) by delta positions and
        re-rotate their keys (llama.cpp's seq_add, then its K-shift); the cells it
        freed below are filled first."""
        bit = np.uint64(1) << np.uint64(seq)
        sel = np.flatnonzero(((self.seqs & bit) != 0) & (self.pos >= p0) & (self.pos < p1))
        if not len(sel) or not delta:
            return
        c0, c1 = int(sel[0]), int(sel[-1]) + 1
        shift = np.zeros(c1 - c0, dtype=np.int32)
        shift[sel - c0] = delta
        shift_keys(self, backend, model, c0, c1, shift)
        self.pos[sel] += delta
        self._refill.add(seq)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """Let dst share src's cells with p0 <= pos < p1 (no copy: cells are shared)."""
        sbit = np.uint64(1) << np.uint64(src)
        sel = (self.seqs & sbit) != 0
        sel &= self.pos >= p0
        if p1 is not None:
            sel &= self.pos < p1
        self.seqs[sel] |= np.uint64(1) << np.uint64(dst)
        self._extent.clear()

    def seq_copy(self, backend, src: int, dst: int, p1: int) -> bool:
        """Give dst its own copy of src's cells with pos < p1, at the start of dst's
        region, as if dst had computed them there; False (nothing done) when those
        cells are not free.

        Why not share the cells (seq_cp): a sequence whose prefix lies in another
        slot's region spans both regions, and its attention would walk every cell in
        between and group cells differently from the sequence alone."""
        src_cells = self._cells_of(src)
        src_cells = src_cells[self.pos[src_cells] < p1]
        src_cells = src_cells[np.argsort(self.pos[src_cells], kind="stable")]
        if len(src_cells) != p1 or not np.array_equal(self.pos[src_cells], np.arange(p1)):
            return False
        r0, _ = self._region(dst)
        dst_cells = np.arange(r0, r0 + p1)
        if r0 + p1 > self.size or self.seqs[dst_cells].any():
            return False
        self.copy_rows(backend, src_cells, dst_cells)
        self.commit(dst_cells, np.full(p1, dst), self.positions_of(src_cells), self.span[src_cells].copy())
        return True

    def copy_rows(self, backend, src_cells: np.ndarray, dst_cells: np.ndarray) -> None:
        """Every layer's K/V rows of src_cells into dst_cells (read before any is written)."""
        g = backend.graph()
        try:
            t_src = g.input("copy_src", ggml.I32, (len(src_cells),))
            t_dst = g.input("copy_dst", ggml.I64, (len(dst_cells),))
            for cache in (t for t in (*self.k, *self.v) if t is not None):
                g.expand(g.set_rows(cache, g.get_rows(cache, t_src), t_dst))
            backend.compute(g, {t_src: src_cells.astype(np.int32), t_dst: dst_cells.astype(np.int64)})
        finally:
            g.close()

    def clear(self) -> None:
        self._refill.clear()
        self.pos[:] = -1
        self.pos_ext[:] = 0
        self.seqs[:] = 0
        self._extent.clear()
        self.span[:] = 0

    # -- per-step graph inputs -----------------------------------------------------

    def view_for(self, seq: int, upto: int | None = None) -> tuple[int, int]:
        """The cell range [c0, c1) llama.cpp would attend over for seq running alone:
        from its first cell, the cells it spans padded to N_KV_PAD (up to cell
        `upto` when given: a drafted row sees what its own decode step would)."""
        lo, last = self._extent_of(seq)
        hi = (last if upto is None else upto) + 1
        n = min(self.size, max(N_KV_PAD, -(-(hi - lo) // N_KV_PAD) * N_KV_PAD))
        c0 = min(lo, self.size - n)
        return c0, c0 + n

    def build_mask(self, c0: int, c1: int, seq_ids: np.ndarray, positions: np.ndarray,
                   spans: np.ndarray | None = None, window: int = 0, chunk: int = 0,
                   pos_ext: np.ndarray | None = None) -> np.ndarray:
        """f16 [n_tokens, c1 - c0]: 0 where token i may attend to cell c0 + j, -inf elsewhere.

        Call after commit(), so the batch's own cells are included. Causal within a
        sequence; with `window`, only the last `window` positions (llama.cpp's
        standard sliding window: masked when pos_tok - pos_cell >= window); with
        `chunk`, only positions of the token's own chunk (llama.cpp's chunked
        attention: masked when pos_cell < pos_tok // chunk * chunk); cells of
        the token's own bidirectional span are visible regardless of position.
        pos_ext (M-RoPE: the tokens' other positions, [n_pos - 1, n_tokens]): a cell at
        the token's own first position is masked when it comes later on the image grid
        (row, then column), as llama.cpp's M-RoPE causal mask (is_2d_gt).
        """
        cpos = self.pos[c0:c1][None, :]
        cseq = self.seqs[c0:c1][None, :]
        tpos = positions[:, None]
        tbit = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))[:, None]
        visible = cpos <= tpos
        if pos_ext is not None and self.n_pos > 1:
            cy, cx = self.pos_ext[0, c0:c1][None, :], self.pos_ext[1, c0:c1][None, :]
            ty, tx = pos_ext[0][:, None], pos_ext[1][:, None]
            visible &= ~((cpos == tpos) & ((cy > ty) | ((cy == ty) & (cx > tx))))
        if spans is not None and spans.any():
            tspan = spans[:, None]
            visible |= (tspan != 0) & (self.span[c0:c1][None, :] == tspan)
        if window:
            visible &= (tpos - cpos) < window
        if chunk:
            visible &= cpos >= tpos // chunk * chunk
        visible &= (cseq & tbit) != 0
        mask = np.full(visible.shape, _NEG_INF, dtype=np.float16)
        mask[visible] = 0
        return mask

    def worst_case_calls(self, n_tokens: int, min_rows: int = 1) -> list[tuple[int, int, int, int, int]]:
        """The attention calls of the largest step (n_tokens, padded to min_rows, over
        every cell), for reserve()."""
        return [(0, n_tokens, 0, self.size, max(n_tokens, min_rows))]

    def step_values(self, cells, seq_ids, positions, spans, calls) -> dict[str, np.ndarray]:
        """This step's cache inputs by name (call after commit): the cells to write,
        and per attention call its mask block."""
        values = {"kv_slots": cells.astype(np.int64)}
        for window, chunk in self.mask_kinds:
            blocks = []
            for t0, t1, c0, c1, rows in calls:
                m = self.build_mask(c0, c1, seq_ids[t0:t1], positions[t0:t1],
                                    None if spans is None else spans[t0:t1], window, chunk,
                                    self.pos_ext[:, cells[t0:t1]] if self.n_pos > 1 else None)
                blocks.append(m.ravel())
                if rows > t1 - t0:       # padding rows (see attention_calls): see every cell
                    blocks.append(np.zeros((rows - (t1 - t0)) * (c1 - c0), dtype=np.float16))
            values[mask_name(window, chunk)] = np.concatenate(blocks)
        values.update(rotation_values())
        return values

    def declare(self, g, n_tokens: int, calls) -> KVStep:
        """Declare the cache inputs of a step with these attention calls in graph g
        (named as step_values names them)."""
        return KVStep(self, calls).declare(g, n_tokens)
