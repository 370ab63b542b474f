"""Per-sequence recurrent state for the recurrent layers of hybrid models.

A recurrent layer (gated delta net, SSM) keeps a fixed-size state per sequence
instead of K/V per token. For each layer and each of its state tensors this holds
one f32 tensor [size, 2 * n_seqs] in a ggml buffer on the layer's device: row
`seq` is the sequence's live state, row `n_seqs + seq` its checkpoint (the state
as it was before the step that is running, so a failed step or a prompt cut back
to that point can be rolled back).

A state reflects every token of its sequence up to `pos[seq]` (exclusive): unlike
the KV cache it cannot be cut at an earlier position, only rolled back to its
checkpoint or reset to empty. Prefix reuse therefore keeps a sequence's cached
prefix only when it ends where the state does (`can_keep`).
"""
from __future__ import annotations

import numpy as np

from ggserve.models.memory import LayerRecurrent
from ggserve.native import ggml


class RecurrentState:
    def __init__(self, backend, layers: list[LayerRecurrent | None], n_seqs: int):
        self.backend = backend
        self.n_seqs = n_seqs
        self.layers = layers
        self.pos = np.zeros(n_seqs, dtype=np.int64)         # tokens the live state reflects
        self.checkpoint_pos = np.zeros(n_seqs, dtype=np.int64)
        self.in_use = np.zeros(n_seqs, dtype=bool)
        by_device: dict = {}
        for il, layer in enumerate(layers):
            if layer is not None:
                by_device.setdefault(layer.device, []).append(il)
        self.buffers, tensors = [], {}
        for device, ils in by_device.items():
            specs = [(f"state_l{il}_{i}", ggml.F32, (size, 2 * n_seqs))
                     for il in ils for i, size in enumerate(layers[il].sizes)]
            buf = backend.alloc(device, specs)
            buf.clear(0)
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
        """Give seq an empty state (all zeros, reflecting no token)."""
        self._zero(seq)
        self.in_use[seq] = True

    def free(self, seq: int) -> None:
        self.in_use[seq] = False
        self.pos[seq] = self.checkpoint_pos[seq] = 0

    def copy(self, src: int, dst: int) -> None:
        """dst's state becomes src's (a shared prefix: dst continues where src is)."""
        self._copy_rows([src], [dst])
        self.pos[dst] = self.pos[src]
        self.in_use[dst] = True

    def can_keep(self, seq: int, n: int) -> bool:
        """Can seq keep its first n tokens? Only where its state ends (or nothing: n == 0)."""
        return n == 0 or (self.in_use[seq] and self.pos[seq] == n)

    def advance(self, seqs, counts) -> None:
        """After a step: seqs[i]'s state now reflects counts[i] more tokens."""
        for s, n in zip(seqs, counts):
            self.pos[s] += n

    # -- checkpoints: taken before a step, restored if it fails ---------------------

    def checkpoint(self, seqs: list[int]) -> None:
        self._copy_rows(seqs, [self.n_seqs + s for s in seqs])
        self.checkpoint_pos[seqs] = self.pos[seqs]

    def rollback(self, seq: int) -> None:
        self._copy_rows([self.n_seqs + seq], [seq])
        self.pos[seq] = self.checkpoint_pos[seq]

    # -- what a step's graph uses --------------------------------------------------

    def step(self, g, seqs: np.ndarray) -> "RecurrentStateStep":
        """Declare this step's state rows (one per distinct sequence, in batch order)."""
        return RecurrentStateStep(self, g.input("state_rows", ggml.I32, (len(seqs),)),
                                  g.input("state_rows_out", ggml.I64, (len(seqs),)))

    @staticmethod
    def step_values(seqs: np.ndarray) -> dict[str, np.ndarray]:
        return {"state_rows": seqs.astype(np.int32), "state_rows_out": seqs.astype(np.int64)}

    # -- helpers -------------------------------------------------------------------

    def _zero(self, seq: int) -> None:
        for t in self.tensors.values():
            row = t.ne[0] * 4
            t.write(np.zeros(t.ne[0], dtype=np.float32), seq * row)
        self.pos[seq] = self.checkpoint_pos[seq] = 0

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
        self.rows = rows
        self.rows_out = rows_out

    def state(self, g, il: int, i: int):
        return g.get_rows(self.states.tensors[(il, i)], self.rows)

    def store(self, g, il: int, i: int, new) -> None:
        g.expand(g.set_rows(self.states.tensors[(il, i)], new, self.rows_out))
