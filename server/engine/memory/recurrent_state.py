"""Per-sequence recurrent state for the recurrent layers of hybrid models.

A recurrent layer (gated delta net, SSM) keeps a fixed-size state per sequence
instead of K/V per token. For each layer and each of its state tensors this holds
one f32 tensor [size, 2 * n_seqs] in a ggml buffer on the layer's device. Two rows
per sequence, `seq` and `n_seqs + seq`, take turns: one is the live state (`live`);
a step reads it and writes the new state into the other, which becomes live only
when the step succeeded (`advance`), so a failed step leaves the live state as it
was. Up to `max_snapshots` copies of a sequence's state at earlier positions
(`snapshot`) wait in host RAM, as llama-server keeps its context checkpoints
(`--ctx-checkpoints`, 32 per slot by default; server-context.cpp create_checkpoint).

A state reflects every token of its sequence up to `pos[seq]` (exclusive): unlike
the KV cache it cannot be cut at any position, only restored to a snapshot or
reset to empty. Prefix reuse therefore keeps a sequence's cached prefix only up
to where the state ends or a snapshot was taken (`reusable`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ggserve.models.memory import LayerRecurrent
from ggserve.native import ggml

CTX_CHECKPOINTS = 32          # saved states per sequence: llama-server's --ctx-checkpoints default
CHECKPOINT_MIN_STEP = 8192    # llama-server's --checkpoint-min-step default: a full list drops those this close first


class Checkpoints(NamedTuple):
    """--ctx-checkpoints and --checkpoint-min-step (-cms)."""
    n: int = CTX_CHECKPOINTS
    min_step: int = CHECKPOINT_MIN_STEP


class RecurrentState:
    def __init__(self, backend, layers: list[LayerRecurrent | None], n_seqs: int,
                 max_snapshots: int = CTX_CHECKPOINTS, min_step: int = CHECKPOINT_MIN_STEP):
        self.backend = backend
        self.n_seqs = n_seqs
        self.max_snapshots = max(0, max_snapshots)
        self.min_step = min_step
        self.layers = layers
        self.pos = np.zeros(n_seqs, dtype=np.int64)         # tokens the live state reflects
        self.live = np.arange(n_seqs, dtype=np.int64)      # the row holding each sequence's live state
        self.in_use = np.zeros(n_seqs, dtype=bool)
        self.snaps: list[dict[int, list]] = [{} for _ in range(n_seqs)]  # per sequence: position -> bytes per tensor
        # which request saved each (a number per sequence: one more for each request it serves)
        self.saved_by: list[dict[int, int]] = [{} for _ in range(n_seqs)]
        self.request = [0] * n_seqs
        by_device: dict = {}
        for il, layer in enumerate(layers):
            if layer is not None:
                by_device.setdefault(layer.device, []).append(il)
        self.buffers, tensors = [], {}
        for device, ils in by_device.items():
            specs = [(f"state_l{il}_{i}", ggml.F32, (size, 2 * n_seqs))
                     for il in ils for i, size in enumerate(layers[il].sizes)]
            buf = backend.alloc(device, specs)    # zeroed
            self.buffers.append(buf)
            tensors.update(buf.tensors)
        # (layer, state index) -> tensor
        self.tensors = {(il, i): tensors[f"state_l{il}_{i}"]
                        for il, layer in enumerate(layers) if layer is not None
                        for i in range(len(layer.sizes))}

    def close(self) -> None:
        for b in self.buffers:
            b.close()
        self.buffers = []

    def nbytes_by_device(self) -> dict:
        out = {}
        for b in self.buffers:
            out[b.device.name] = out.get(b.device.name, 0) + b.nbytes
        return out

    # -- per sequence ------------------------------------------------------------

    def alloc(self, seq: int) -> None:
        """Give seq an empty state (all zeros, reflecting no token), for a new request."""
        self._zero(seq)
        self._forget_saved(seq)
        self.request[seq] += 1
        self.in_use[seq] = True

    def free(self, seq: int) -> None:
        self.in_use[seq] = False
        self.pos[seq] = 0
        self._forget_saved(seq)

    def _forget_saved(self, seq: int) -> None:
        self.snaps[seq].clear()
        self.saved_by[seq].clear()

    def reusable(self, seq: int, n: int) -> int:
        """The most of seq's first n tokens whose state seq has: where its live state
        ends, or a snapshot (0: none)."""
        if not self.in_use[seq]:
            return 0
        return max([p for p in (int(self.pos[seq]), *self.snaps[seq]) if p <= n], default=0)

    def keep(self, seq: int, n: int) -> None:
        """seq's state goes back to its first n tokens (n from `reusable`, > 0), for a new
        request. A saved state it resumes from counts as saved by that request: llama-server
        makes a checkpoint again where the resumed prompt's first batch starts."""
        if n != self.pos[seq]:
            self._write_row(int(self.live[seq]), self.snaps[seq][n])
            self.pos[seq] = n
        self.snaps[seq] = {p: r for p, r in self.snaps[seq].items() if p <= n}
        self.saved_by[seq] = {p: r for p, r in self.saved_by[seq].items() if p <= n}
        self.request[seq] += 1
        if n in self.snaps[seq]:
            self._save(seq, n, self.snaps[seq][n])

    def copy(self, src: int, dst: int, n: int) -> None:
        """dst's state becomes src's after its first n tokens (n from `reusable`, > 0):
        a shared prefix, dst continues from there."""
        if n == self.pos[src]:
            self._copy_rows([self.live[src]], [self.live[dst]])
        else:
            self._write_row(int(self.live[dst]), self.snaps[src][n])
        self.pos[dst] = n
        self._forget_saved(dst)
        self.request[dst] += 1
        self.in_use[dst] = True

    def advance(self, seqs, counts) -> None:
        """After a step succeeded: seqs[i]'s new state (in its other row) is live and
        reflects counts[i] more tokens."""
        for s, n in zip(seqs, counts):
            self.live[s] = self._other(self.live[s])
            self.pos[s] += n

    def snapshot(self, seqs) -> None:
        """Keep a copy of each of seqs' live state at its position in host RAM."""
        if not self.max_snapshots:
            return
        for s in seqs:
            self._save(s, int(self.pos[s]), self._read_row(int(self.live[s])))

    def _save(self, s: int, p: int, rows: list) -> None:
        """As llama-server's create_checkpoint (server-context.cpp): with max_snapshots - 1
        saved or more, each state within min_step of the one kept before it goes, unless
        this request saved it, until one fewer is left; then the furthest back while the
        list is full; one at position p is replaced."""
        snaps, saved_by, request = self.snaps[s], self.saved_by[s], self.request[s]
        last = -1
        for q in sorted(snaps):
            if len(snaps) + 1 < self.max_snapshots:
                break
            if saved_by.get(q) != request and last >= 0 and q <= last + self.min_step:
                del snaps[q], saved_by[q]
                continue
            last = q
        for q in sorted(snaps)[:max(0, len(snaps) - self.max_snapshots + 1)]:
            del snaps[q], saved_by[q]
        snaps.pop(p, None)
        snaps[p], saved_by[p] = rows, request

    # -- host copies (server/engine/memory/snapshot.py) --------------------------------------

    def row_bytes(self) -> list[int]:
        """Bytes of one state row of each (layer, state) tensor, in `tensors` order."""
        return [t.ne[0] * 4 for t in self.tensors.values()]

    def export(self, seq: int, upto: int) -> dict[int, list[bytes]]:
        """seq's states at positions <= upto (the live one and the saved ones):
        position -> one bytes per (layer, state) tensor."""
        if not self.in_use[seq]:
            return {}
        states = {**self.snaps[seq], int(self.pos[seq]): self._read_row(int(self.live[seq]))}
        return {p: st for p, st in sorted(states.items()) if 0 < p <= upto}

    def import_(self, seq: int, states: dict[int, list[bytes]], n: int) -> None:
        """seq's state becomes the one at position n of `states` (from export), the
        others before n (up to max_snapshots, the latest) its saved ones."""
        self.alloc(seq)
        self._write_row(int(self.live[seq]), states[n])
        older = sorted(p for p in states if p < n)
        self.snaps[seq] = {p: list(states[p]) for p in older[len(older) - self.max_snapshots:]} \
            if self.max_snapshots else {}
        self.saved_by[seq] = dict.fromkeys(self.snaps[seq], -1)    # by no request of this server's
        self.pos[seq] = n

    # -- what a step's graph uses --------------------------------------------------

    def step(self, g, seqs) -> "RecurrentStateStep":
        """Declare this step's state rows (one per sequence, in batch order)."""
        return RecurrentStateStep(self, g.input("state_rows", ggml.I32, (len(seqs),)),
                                  g.input("state_rows_out", ggml.I64, (len(seqs),)))

    def step_values(self, seqs: np.ndarray) -> dict[str, np.ndarray]:
        """The rows a step reads (live) and writes (the others) for these sequences."""
        live = self.live[seqs]
        return {"state_rows": live.astype(np.int32), "state_rows_out": self._other(live).astype(np.int64)}

    # -- helpers -------------------------------------------------------------------

    def _read_row(self, row: int) -> list[bytes]:
        """One row of every (layer, state) tensor, as bytes."""
        return [t.read_bytes(row * n, n) for t, n in zip(self.tensors.values(), self.row_bytes())]

    def _write_row(self, row: int, state: list) -> None:
        for t, data, size in zip(self.tensors.values(), state, self.row_bytes()):
            t.write(np.frombuffer(data, dtype=np.uint8, count=size), row * size)

    def _other(self, rows):
        """The other row of the sequences whose rows these are."""
        return np.where(rows < self.n_seqs, rows + self.n_seqs, rows - self.n_seqs)

    def _zero(self, seq: int) -> None:
        for t in self.tensors.values():
            row = t.ne[0] * 4
            t.write(np.zeros(t.ne[0], dtype=np.float32), int(self.live[seq]) * row)
        self.pos[seq] = 0

    def _copy_rows(self, src: list[int], dst: list[int]) -> None:
        if not src or not self.tensors:
            return
        g = self.backend.graph()
        try:
            t_src = g.input("state_src", ggml.I32, (len(src),))
            t_dst = g.input("state_dst", ggml.I64, (len(dst),))
            for t in self.tensors.values():
                g.expand(g.set_rows(t, g.get_rows(t, t_src), t_dst))
            self.backend.compute(g, {t_src: np.asarray(src, dtype=np.int32),
                                     t_dst: np.asarray(dst, dtype=np.int64)})
        finally:
            g.close()


class RecurrentStateStep:
    """One step's view of the states, for the model's recurrent layers."""

    def __init__(self, states: RecurrentState, rows, rows_out):
        self.states = states
        self.live_rows = rows
        self.rows_out = rows_out

    def state(self, g, il: int, i: int):
        return g.get_rows(self.states.tensors[(il, i)], self.live_rows)

    def store(self, g, il: int, i: int, new) -> None:
        g.expand(g.set_rows(self.states.tensors[(il, i)], new, self.rows_out))

    def rows(self, g, il: int, i: int):
        return self.states.tensors[(il, i)], self.live_rows
