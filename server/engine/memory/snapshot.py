"""A sequence's memory as plain bytes in host RAM: taken from the KV cache and put
back into it, bit for bit.

What the host-RAM prompt cache (server/engine/memory/host_cache.py) and slot files
(server/engine/memory/slot_files.py) hold. A snapshot keeps the raw rows of every attention
layer's K and V for the sequence's cells in position order, with the cells'
positions and image-span ids; put back at the start of a sequence's cells (where
the sequence would have computed them), the next step attends over exactly what it
would have had the prefix never left. For a model with recurrent layers the
snapshot also holds the sequence's states where it has them (where it ends, and
the points saved on its way, server/engine/memory/recurrent_state.py): it can give back a
prefix only up to one of those points (`reusable`). A model with a sliding-window
ring (server/engine/memory/swa_ring.py) has its ring's cells of the sequence beside them
(`RingRows`, in the order they lay in the ring), as llama.cpp's iSWA cache saves both of
its caches (llama-kv-cache-iswa.cpp state_write).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggserve.native import ggml
from ggserve.server.engine.memory.model_memory import Memory


@dataclass
class RingRows:
    """A sequence's cells of the sliding-window ring, in ring order (not position order:
    a wrapped ring holds its newest positions first)."""
    positions: np.ndarray  # int32 [m]
    spans: np.ndarray      # int64 [m]
    k: list                # per layer: bytes of m rows, or None (a layer outside the ring)
    v: list
    window: int

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in (*self.k, *self.v) if b is not None) + self.positions.nbytes + self.spans.nbytes

    def holds_window(self, n: int) -> bool:
        """Does it hold the positions the window shows token n (n - window .. n - 1)?"""
        return len(self.positions) > 0 and int(self.positions.min()) <= max(0, n - self.window)


@dataclass
class Snapshot:
    tokens: tuple          # the tokens whose memory this is (image placeholders included)
    positions: np.ndarray  # int32 [n_pos, n]
    spans: np.ndarray      # int64 [n]: bidirectional span id per cell (0: none)
    k: list                # per layer: bytes of n rows, or None (a layer without attention)
    v: list
    states: dict | None = None   # recurrent layers: position -> bytes per state tensor; None without
    salt: str = ""               # the cache salt of the requests that computed it (Request.cache_salt)
    ring: RingRows | None = None  # the sliding-window ring's cells; None without a ring

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        rows = sum(len(b) for b in (*self.k, *self.v) if b is not None)
        rows += sum(len(b) for st in (self.states or {}).values() for b in st)
        rows += self.ring.nbytes if self.ring is not None else 0
        return rows + self.positions.nbytes + self.spans.nbytes + 8 * self.n

    def reusable(self, n: int) -> int:
        """How many of the first n tokens this snapshot can give back (with recurrent
        states: up to the furthest state point at or before n)."""
        n = min(n, self.n)
        if self.ring is not None and not self.ring.holds_window(n):
            return 0        # the ring lost what the window shows the next token: computed again
        return n if self.states is None else max((p for p in self.states if p <= n), default=0)


def row_sizes(memory: Memory) -> list:
    """Bytes per cell of each layer's K and V: [(k, v) or None]."""
    return _row_sizes(memory.kv)


def _row_sizes(cache) -> list:
    return [None if k is None else (k.nb[1], 0 if v is None else v.nb[1]) for k, v in zip(cache.k, cache.v)]


def _runs(cells: np.ndarray):
    """(i, first cell, count) of each run of consecutive cells, in the given order."""
    if not len(cells):
        return []
    starts = np.concatenate([[0], np.flatnonzero(np.diff(cells) != 1) + 1])
    ends = np.concatenate([starts[1:], [len(cells)]])
    return [(int(a), int(cells[a]), int(b - a)) for a, b in zip(starts, ends)]


def _cells(memory: Memory, seq: int) -> np.ndarray:
    """seq's cells in position order (then index order)."""
    kv = memory.kv
    cells = np.flatnonzero((kv.seqs & (np.uint64(1) << np.uint64(seq))) != 0)
    return cells[np.argsort(kv.pos[cells], kind="stable")]


def _read(cache, cells: np.ndarray) -> tuple[list, list]:
    """(K, V) of every layer: the rows of these cells, in this order (b"" for a V kept in K)."""
    runs = _runs(cells)

    def read(t):
        row = t.nb[1]
        return b"".join(t.read_bytes(c * row, m * row) for _, c, m in runs)

    return ([None if t is None else read(t) for t in cache.k],
            [None if kt is None else b"" if t is None else read(t) for kt, t in zip(cache.k, cache.v)])


def _write(cache, cells: np.ndarray, k: list, v: list, which: np.ndarray | None = None) -> None:
    """Rows of k and v into these cells, in this order: the first len(cells), or those
    `which` picks."""
    runs = _runs(cells)
    for t, data in (*zip(cache.k, k), *zip(cache.v, v)):
        if t is None:
            continue
        row = t.nb[1]
        if which is None:
            rows = np.frombuffer(data, dtype=np.uint8, count=len(cells) * row)
        else:
            rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, row)[which].reshape(-1)
        for i, c, m in runs:
            t.write(rows[i * row:(i + m) * row], c * row)


def capture(memory: Memory, seq: int, tokens) -> Snapshot | None:
    """The memory of seq, which holds exactly these tokens; None when it cannot be
    taken (cells that do not match the tokens, or no recurrent state to give back)."""
    if not tokens:
        return None
    states = None
    if memory.recurrent is not None:
        states = memory.recurrent.export(seq, len(tokens))
        if not states:
            return None
    kv = memory.kv
    cells = _cells(memory, seq)
    if len(cells) != len(tokens):
        return None
    ring = None
    if memory.swa is not None:
        mine = memory.swa._cells_of(seq)          # ascending: the ring's order
        ring = RingRows(memory.swa.pos[mine].astype(np.int32), memory.swa.span[mine].astype(np.int64),
                        *_read(memory.swa, mine), memory.swa.window)
    return Snapshot(tuple(tokens), kv.positions_of(cells).astype(np.int32), kv.span[cells].astype(np.int64),
                    *_read(kv, cells), states, ring=ring)


def restore(memory: Memory, seq: int, snap: Snapshot, n: int | None = None) -> int:
    """seq (holding nothing) gets the snapshot's first n tokens (all by default; n
    from `reusable`), in the cells it would have computed them in. -> n; 0 when
    there is no room."""
    n = snap.n if n is None else n
    if n <= 0 or snap.reusable(n) != n or (memory.swa is None) != (snap.ring is None):
        return 0
    kv = memory.kv
    try:
        cells = kv.find_cells_for([seq], [n])
        # the ring's cells go back whole, then those from position n on leave (llama-server
        # restores a cache entry whole, then cuts it where the prompt differs)
        cut = int(snap.positions[0, n - 1]) + 1
        ring = memory.swa.restore(seq, snap.ring.positions, snap.ring.spans, cut) if snap.ring is not None else None
    except Exception:          # KVCacheFull: the caller computes the prefix instead
        return 0
    _write(kv, cells, snap.k, snap.v)
    kv.commit(cells, np.full(n, seq, dtype=np.int64), snap.positions[:, :n], snap.spans[:n])
    if ring is not None:
        ring_cells, which = ring
        _write(memory.swa, ring_cells, snap.ring.k, snap.ring.v, which)
        memory.swa.seq_rm(seq, cut)
    if memory.recurrent is not None:
        memory.recurrent.import_(seq, snap.states, n)
    return n


def layout(memory: Memory) -> dict:
    """What a snapshot's bytes depend on besides the weights: cache types, row sizes,
    positions per token."""
    kv = memory.kv
    return {"type_k": ggml.type_name(kv.type_k), "type_v": ggml.type_name(kv.type_v),
            "n_pos": kv.n_pos, "rows": [list(r) if r else None for r in row_sizes(memory)],
            "recurrent": memory.recurrent.row_bytes() if memory.recurrent is not None else [],
            **({"ring": [list(r) if r else None for r in _row_sizes(memory.swa)], "ring_window": memory.swa.window}
               if memory.swa is not None else {})}
