"""Each row of a step with its own request's LoRA adapters (server/engine/adapters.py).

Requests with different adapter sets, or none, share a step: nothing is split or
serialised for them. For every adapter some row of the step uses, the graph computes
B (A x) over all the step's rows and multiplies it by a per-row scale before adding it
to W x: the row's scale * alpha / rank for rows whose request uses the adapter, 0 for
the others (their W x gains + 0, exactly nothing). So each row gets llama.cpp's
W x + scale * B (A x) for each of its adapters, as when its request runs alone (the
products of A and B take llama.cpp's kernel per row like any float matrix:
kernel_parity's "sgemm" plans). The adapters of a row are added in descending id
order, the order in which llama.cpp visits its std::unordered_map of them (libstdc++
puts each new key first), which decides how a mix rounds.
"""
from __future__ import annotations

import numpy as np

from ggserve.native import ggml


def scale_name(adapter: int, rank: int) -> str:
    return f"lora_scale_{adapter}_{rank}"


def step_values(adapters, chunks, n: int) -> tuple[tuple, dict]:
    """(the adapters the step's rows use, in the order they are added; the per-row scale
    inputs, f32 [n] by name) for a batch of `chunks` (n rows)."""
    if adapters is None or not adapters.loras:
        return (), {}
    used = {}
    row = 0
    for c in chunks:
        for i, s in c.seq.request.adapters:
            used.setdefault(i, []).append((row, c.n, s))
        row += c.n
    active = tuple(sorted(used, reverse=True))
    values = {}
    for i in active:
        lora = adapters.loras[i]
        for rank in lora.ranks:
            v = np.zeros(n, np.float32)
            for r0, k, s in used[i]:
                v[r0:r0 + k] = lora.scale(s, rank)
            values[scale_name(i, rank)] = v
    return active, values


class AdapterGraph:
    """What ForwardInputs.mm calls after each weight's product (its `adapters`)."""

    def __init__(self, g, adapters, active: tuple, n_tokens: int):
        self.loras = adapters.loras
        self.active = active
        self.scales = {(i, r): g.input(scale_name(i, r), ggml.F32, (1, n_tokens))
                       for i in active for r in self.loras[i].ranks}
        self._picked = {}

    def add(self, g, inp, w, x, y):
        """y = w x (+ each active adapter's scaled B (A x) for w)."""
        for i in self.active:
            pair = self.loras[i].pairs.get(w)
            if pair is None:
                continue
            d = inp.mm(g, pair.b, inp.mm(g, pair.a, x))               # [n_out, rows]
            y = g.add(y, g.mul(d, self._rows(g, inp, (i, pair.rank), x.ne[1])))
        return y

    def _rows(self, g, inp, key, m: int):
        """The per-row scales of the m rows x holds: the batch's, or (after the last layer
        picks them) the output rows', or the LM head's logit rows'."""
        full = self.scales[key]
        if m == inp.n_tokens:
            return full
        if (key, m) not in self._picked:
            out = full if inp.out_ids is None else g.get_rows(full, inp.out_ids)
            self._picked[key, m] = out if m == out.ne[1] else g.get_rows(out, inp.logit_rows)
        return self._picked[key, m]
