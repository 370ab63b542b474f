"""The KV cache: cells with positions and sequence sets, K/V storage in ggml buffers.

One unified cache holds every sequence. Each cell has a position and a set of
sequences (a bitmask: a prefix shared by several sequences is stored once). The
cache plans placement for a whole batch before touching anything, builds the
attention masks (causal, per-sequence, sliding window, bidirectional spans) and
runs attention for the models, so models never see cell indices.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggserve.native import ggml

MAX_SEQS = 63          # sequences are bits of a uint64; bit 63 owns the scratch cell
SCRATCH_SEQ = 63       # cell 0 belongs to this pseudo-sequence (see KVCache.scratch_row)
SPLIT_KV_MIN = 512     # ggml's CPU flash attention splits the cells across threads from here
N_KV_PAD = 256         # attend over a multiple of 256 cells, as llama.cpp does

_NEG_INF = np.float16(-np.inf)


@dataclass(frozen=True)
class LayerKV:
    """What one layer stores per token: K and V row widths, its device, its window."""

    n_embd_k: int
    n_embd_v: int
    device: object
    sliding_window: int = 0     # 0: global attention


class KVCacheFull(RuntimeError):
    pass


class KVCache:
    def __init__(self, backend, layers: list[LayerKV], size: int,
                 type_k=ggml.F16, type_v=ggml.F16):
        self.size = size
        self.layers = layers
        self.type_k = type_k
        self.type_v = type_v
        self.pos = np.full(size, -1, dtype=np.int32)
        self.seqs = np.zeros(size, dtype=np.uint64)
        self._reserve_scratch()
        # span id per cell: cells of one bidirectional span (an image) see each other
        self.span = np.zeros(size, dtype=np.int64)
        self.buffers = []
        self.k, self.v = [], []
        by_device = {}
        for il, layer in enumerate(layers):
            by_device.setdefault(layer.device, []).append(il)
        tensors = {}
        for device, ils in by_device.items():
            specs = []
            for il in ils:
                specs.append((f"cache_k_l{il}", type_k, (layers[il].n_embd_k, size)))
                specs.append((f"cache_v_l{il}", type_v, (layers[il].n_embd_v, size)))
            buf = backend.alloc(device, specs)
            self.buffers.append(buf)
            tensors.update(buf.tensors)
        self.k = [tensors[f"cache_k_l{il}"] for il in range(len(layers))]
        self.v = [tensors[f"cache_v_l{il}"] for il in range(len(layers))]
        self.has_swa = any(l.sliding_window for l in layers)

    def close(self):
        for b in self.buffers:
            b.close()
        self.buffers = []

    # -- bookkeeping -------------------------------------------------------------

    def _reserve_scratch(self) -> None:
        self.pos[0] = 0
        self.seqs[0] = np.uint64(1) << np.uint64(SCRATCH_SEQ)

    def needs_scratch_row(self, n_rows: int, cells: np.ndarray) -> bool:
        """Why: ggml's CPU flash attention takes another code path (cells split across
        threads, partial sums combined) for a batch of exactly one row over >= 512
        cells, and that path rounds differently. A second row keeps every batch on one
        path, so a sequence's tokens do not depend on what else is running."""
        return n_rows == 1 and self.n_kv_for(cells) >= SPLIT_KV_MIN

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.seqs)) - 1     # the scratch cell is not a token

    @property
    def n_free(self) -> int:
        return self.size - self.n_used

    def nbytes_by_device(self) -> dict:
        out = {}
        for b in self.buffers:
            out[b.device.name] = out.get(b.device.name, 0) + b.nbytes
        return out

    def find_cells_for(self, seqs: list[int], counts: list[int]) -> np.ndarray:
        """Plan cells for a batch made of `counts[i]` new tokens of sequence `seqs[i]`.

        Why: flash attention visits cells in index order and rounds as it goes, so a
        sequence must see its tokens in the same order however its cells were
        obtained (fresh, or a prefix shared from another sequence). Each sequence's
        new cells therefore come after every cell it already has; only when no
        room is left above does it take lower cells. No mutation.
        """
        free = self.seqs == 0
        if int(free.sum()) < sum(counts):
            raise KVCacheFull(f"need {sum(counts)} KV cells, {int(free.sum())} free")
        out = []
        for seq, n in zip(seqs, counts):
            bit = np.uint64(1) << np.uint64(seq)
            mine = np.flatnonzero((self.seqs & bit) != 0)
            above = np.flatnonzero(free[mine[-1] + 1:]) + mine[-1] + 1 if len(mine) else np.flatnonzero(free)
            cells = above[:n]
            if len(cells) < n:
                rest = np.flatnonzero(free)
                rest = rest[~np.isin(rest, cells)]
                cells = np.sort(np.concatenate([cells, rest[: n - len(cells)]]))
            free[cells] = False
            out.append(cells)
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def commit(self, cells: np.ndarray, seq_ids: np.ndarray, positions: np.ndarray,
               spans: np.ndarray | None = None) -> None:
        """Apply a plan: cells now hold these sequences' tokens at these positions."""
        self.pos[cells] = positions
        self.seqs[cells] = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))
        self.span[cells] = 0 if spans is None else spans

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> None:
        """Remove seq from cells with p0 <= pos < p1 (p1 None: to the end)."""
        bit = np.uint64(1) << np.uint64(seq)
        sel = (self.seqs & bit) != 0
        sel &= self.pos >= p0
        if p1 is not None:
            sel &= self.pos < p1
        self.seqs[sel] &= ~bit
        self.pos[self.seqs == 0] = -1
        self._reserve_scratch()

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """Let dst share src's cells with p0 <= pos < p1 (no copy: cells are shared)."""
        sbit = np.uint64(1) << np.uint64(src)
        sel = (self.seqs & sbit) != 0
        sel &= self.pos >= p0
        if p1 is not None:
            sel &= self.pos < p1
        self.seqs[sel] |= np.uint64(1) << np.uint64(dst)

    def clear(self) -> None:
        self.pos[:] = -1
        self.seqs[:] = 0
        self.span[:] = 0
        self._reserve_scratch()

    # -- per-step graph inputs -----------------------------------------------------

    def n_kv_for(self, cells: np.ndarray) -> int:
        used = np.flatnonzero(self.seqs)
        hi = max(int(used.max()) + 1 if len(used) else 0, int(cells.max()) + 1 if len(cells) else 0)
        return min(self.size, max(N_KV_PAD, -(-hi // N_KV_PAD) * N_KV_PAD))

    def build_mask(self, n_kv: int, seq_ids: np.ndarray, positions: np.ndarray,
                   spans: np.ndarray | None = None, window: int = 0) -> np.ndarray:
        """f16 [n_tokens, n_kv]: 0 where token i may attend to cell j, -inf elsewhere.

        Call after commit(), so the batch's own cells are included. Causal within a
        sequence; with `window`, only the last `window` positions (llama.cpp's
        standard sliding window: masked when pos_tok - pos_cell >= window); cells of
        the token's own bidirectional span are visible regardless of position.
        """
        cpos = self.pos[:n_kv][None, :]
        cseq = self.seqs[:n_kv][None, :]
        tpos = positions[:, None]
        tbit = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))[:, None]
        same_seq = (cseq & tbit) != 0
        visible = cpos <= tpos
        if spans is not None and spans.any():
            tspan = spans[:, None]
            visible |= (tspan != 0) & (self.span[:n_kv][None, :] == tspan)
        if window:
            visible &= (tpos - cpos) < window
        allowed = same_seq & visible
        mask = np.full(allowed.shape, _NEG_INF, dtype=np.float16)
        mask[allowed] = 0
        return mask

    def step_worst_case(self, g, n_tokens: int) -> "KVStep":
        """Inputs shaped for the largest step (n_tokens over every cell), for reserve()."""
        st = KVStep(self, self.size)
        st.slots = g.input("kv_slots", ggml.I64, (n_tokens,))
        st.mask = g.input("kq_mask", ggml.F16, (self.size, n_tokens))
        if self.has_swa:
            st.mask_swa = g.input("kq_mask_swa", ggml.F16, (self.size, n_tokens))
        return st

    def step(self, g, cells, seq_ids, positions, spans=None) -> "KVStep":
        """Declare this step's cache inputs in graph g (call after commit)."""
        n_kv = self.n_kv_for(cells)
        n_tokens = len(cells)
        st = KVStep(self, n_kv)
        st.slots = g.input("kv_slots", ggml.I64, (n_tokens,))
        st.mask = g.input("kq_mask", ggml.F16, (n_kv, n_tokens))
        st.values = {
            st.slots: cells.astype(np.int64),
            st.mask: self.build_mask(n_kv, seq_ids, positions, spans),
        }
        if self.has_swa:
            window = max(l.sliding_window for l in self.layers)
            st.mask_swa = g.input("kq_mask_swa", ggml.F16, (n_kv, n_tokens))
            st.values[st.mask_swa] = self.build_mask(n_kv, seq_ids, positions, spans, window)
        st.groups = self._group_ranges(seq_ids, n_kv)
        return st

    def _group_ranges(self, seq_ids: np.ndarray, n_kv: int) -> list[tuple[int, int, int, int]]:
        """(first row, end row, first cell, end cell) per attention row group.

        Why: flash attention walks every cell it is given, masked or not, so rows of
        a prompt chunk attend only over the cell range their own sequences occupy
        (padded to N_KV_PAD). Skipped cells never change a row's result, so this
        only saves time."""
        lo_of, hi_of = {}, {}
        for s in np.unique(seq_ids):
            mine = np.flatnonzero((self.seqs[:n_kv] & (np.uint64(1) << np.uint64(s))) != 0)
            lo_of[s], hi_of[s] = int(mine[0]), int(mine[-1]) + 1
        out = []
        for t0, t1 in _row_groups(len(seq_ids)):
            group = np.unique(seq_ids[t0:t1])
            lo = min(lo_of[s] for s in group) // N_KV_PAD * N_KV_PAD
            hi = min(n_kv, -(-max(hi_of[s] for s in group) // N_KV_PAD) * N_KV_PAD)
            out.append((t0, t1, lo, hi))
        return out


# ggml's CPU flash attention computes a batch of >= 64 query rows with a tiled
# f32 kernel and smaller batches row by row (f16 accumulation); a lone row over
# >= 512 cells is split across threads. Attending in groups of at most ROW_GROUP
# rows (never a lone row: see KVCache.needs_scratch_row) keeps every row on the
# row-by-row kernel, so a sequence's tokens never depend on what shares its batch.
ROW_GROUP = 32


def _row_groups(n: int) -> list[tuple[int, int]]:
    bounds = list(range(0, n, ROW_GROUP)) + [n]
    groups = list(zip(bounds[:-1], bounds[1:]))
    if len(groups) > 1 and groups[-1][1] - groups[-1][0] == 1:
        (a, _), (_, d) = groups[-2], groups[-1]
        groups[-2:] = [(a, d)]            # merge a lone last row into the group before
    return groups


class KVStep:
    """One step's view of the cache: slots to write, masks, and attention over cells."""

    def __init__(self, cache: KVCache, n_kv: int):
        self.cache = cache
        self.n_kv = n_kv
        self.slots = None
        self.mask = None
        self.mask_swa = None
        self.values = {}
        self.groups = None

    def attention(self, g, il: int, q, k, v, scale: float, softcap: float = 0.0):
        """Store this batch's k, v for layer il, then attend q over the cache.

        q: [head_dim, n_head, n_tokens], k/v: [head_dim, n_head_kv, n_tokens]
        -> [head_dim * n_head, n_tokens]
        """
        cache = self.cache
        head_dim_k, n_head_kv, n_tokens = k.ne[0], k.ne[1], k.ne[2]
        head_dim_v = v.ne[0]
        kc, vc = cache.k[il], cache.v[il]
        g.expand(g.set_rows(kc, g.reshape(k, head_dim_k * n_head_kv, n_tokens), self.slots))
        g.expand(g.set_rows(vc, g.reshape(v, head_dim_v * n_head_kv, n_tokens), self.slots))

        rk = ggml.row_size(cache.type_k, head_dim_k)
        rv = ggml.row_size(cache.type_v, head_dim_v)
        mask = self.mask_swa if cache.layers[il].sliding_window else self.mask
        # Row groups below ggml's tiled threshold: every row then takes the same
        # per-row kernel whatever else is in the batch (see ROW_GROUP).
        outs = []
        groups = self.groups or [(t0, t1, 0, self.n_kv) for t0, t1 in _row_groups(n_tokens)]
        for t0, t1, c0, c1 in groups:
            qg = g.view(q, (q.ne[0], q.ne[1], t1 - t0), (q.nb[1], q.nb[2]), t0 * q.nb[2])
            mg = g.view(mask, (c1 - c0, t1 - t0), (mask.nb[1],), t0 * mask.nb[1] + c0 * mask.nb[0])
            if c1 - c0 != self.n_kv and t1 - t0 > 1:
                mg = g.cont(mg)                       # flash attention wants a contiguous mask
            kg = g.view(kc, (head_dim_k, n_head_kv, c1 - c0), (rk, kc.nb[1]), c0 * kc.nb[1])
            vg = g.view(vc, (head_dim_v, n_head_kv, c1 - c0), (rv, vc.nb[1]), c0 * vc.nb[1])
            qg = g.permute(qg, 0, 2, 1, 3)            # [head_dim, rows, n_head]
            kg = g.permute(kg, 0, 2, 1, 3)            # [head_dim, cells, n_head_kv]
            vg = g.permute(vg, 0, 2, 1, 3)
            outs.append(g.flash_attn(qg, kg, vg, mg, scale, 0.0, softcap))  # [head_dim_v, n_head, rows]
        out = outs[0]
        for o in outs[1:]:
            out = g.concat(out, o, 2)
        return g.reshape(out, head_dim_v * q.ne[1], n_tokens)
