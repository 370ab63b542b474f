"""One step's attention over the KV cache, and the K-shift of shifted cells.

KVStep stores a batch's K/V rows and attends over the cache for the models. With
a quantized cache, Q, K and V are turned by a Walsh-Hadamard rotation before
they are stored (and the output turned back), as llama.cpp 11434 does
(llama-graph.cpp build_attn, attn_rot_k / attn_rot_v): the rotation spreads
outliers over a block, so quantizing loses less, and answers equal llama.cpp's
only with it. shift_keys re-rotates the keys of cells whose positions moved
(context shift), as llama.cpp's K-shift graph (llama-kv-cache.cpp build_graph_shift).
"""
from __future__ import annotations

import numpy as np

from ggserve.native import ggml

_PLAIN = (ggml.F32, ggml.F16)       # types rope reads and writes in place of a rotation


def mask_name(window: int, chunk: int) -> str:
    if not (window or chunk):
        return "kq_mask"
    return f"kq_mask_w{window}_c{chunk}"


def rotation_size(cache_type: int, head_dim: int, is_k: bool) -> int:
    """The Hadamard block llama.cpp turns a head's rows by (0: none): for quantized
    caches, 64 for V; for K the largest power of two >= 64 dividing the head."""
    if cache_type in (ggml.F32, ggml.F16, ggml.BF16) or head_dim % 64:
        return 0
    n = 64
    while is_k and head_dim % (2 * n) == 0:
        n *= 2
    return n


_HADAMARD: dict[int, np.ndarray] = {}


def hadamard(n: int) -> np.ndarray:
    """f32 [n, n] orthonormal Walsh-Hadamard matrix (llama.cpp's ggml_gen_hadamard;
    the CPU backend runs a fast transform instead of reading it)."""
    if n not in _HADAMARD:
        h = np.ones((1, 1), dtype=np.float32)
        while h.shape[0] < n:
            h = np.block([[h, h], [h, -h]])
        _HADAMARD[n] = (h * np.float32(1.0 / np.sqrt(np.float32(n)))).astype(np.float32)
    return _HADAMARD[n]


def _turn(g, t, rot):
    """t turned by the Hadamard matrix rot block by block (llama_mul_mat_hadamard)."""
    n = rot.ne[0]
    ne = [x for x in t.ne]
    size = ne[0] * ne[1] * ne[2] * ne[3]
    contiguous = t.nb[1] == t.nb[0] * ne[0] and t.nb[2] == t.nb[1] * ne[1] and t.nb[3] == t.nb[2] * ne[2]
    flat = g.reshape(t if contiguous else g.cont(t), n, size // n)
    out = g.mul_mat(rot, flat, hadamard=True)
    shape = tuple(ne[:max(1, len(t.shape))])
    return g.reshape(out, *shape)


class KVStep:
    """One step's view of the cache: slots to write, masks, and attention calls."""

    def __init__(self, cache, calls):
        self.cache = cache
        self.calls = calls
        self.slots = None
        self.masks = {}       # (window, chunk) -> mask input
        self._g = None
        self._rot = {}        # block size -> Hadamard matrix input

    def declare(self, g, n_tokens: int) -> "KVStep":
        cache = self.cache
        n_mask = sum(rows * (c1 - c0) for _, _, c0, c1, rows in self.calls)
        self.slots = g.input("kv_slots", ggml.I64, (n_tokens,))
        self.masks = {kind: g.input(mask_name(*kind), ggml.F16, (n_mask,)) for kind in cache.mask_kinds}
        self._g = g
        return self

    def rotation(self, n: int):
        """The graph input holding the n x n Hadamard matrix (step values: kv_rot_{n})."""
        if n not in self._rot:
            self._rot[n] = self._g.input(f"kv_rot_{n}", ggml.F32, (n, n))
        return self._rot[n]

    def attention(self, g, il: int, q, k, v, scale: float, softcap: float = 0.0, sinks=None):
        """Store this batch's k, v for layer il, then attend q over the cache.

        q: [head_dim, n_head, n_tokens], k/v: [head_dim, n_head_kv, n_tokens]
        -> [head_dim * n_head, n_tokens]; sinks: f32 [n_head] attention-sink logits
        (ggml's flash_attn_ext sinks, gpt-oss), or None. k, v None: the layer's spec
        has `kv_from`, and q attends over that layer's cells (nothing stored).
        """
        cache = self.cache
        layer = cache.layers[il]
        src = il if layer.kv_from < 0 else layer.kv_from     # kv_from: another layer's K/V, k and v None
        n_tokens = q.ne[2]
        if k is None:
            head_dim_k = q.ne[0]
            n_head_kv = layer.n_embd_k // head_dim_k
            head_dim_v = layer.n_embd_v // n_head_kv
        else:
            head_dim_k, n_head_kv, head_dim_v = k.ne[0], k.ne[1], v.ne[0]
        kc, vc = cache.k[src], cache.v[src]
        v_in_k = vc is None       # V: the first head_dim_v values of each K row (v only gives the width)
        rot_k = rotation_size(cache.type_k, head_dim_k, True)
        rot_v = rot_k if v_in_k else rotation_size(cache.type_v, head_dim_v, False)
        if rot_k:
            q = _turn(g, q, self.rotation(rot_k))
        if k is not None:
            if rot_k:
                k = _turn(g, k, self.rotation(rot_k))
            if rot_v and not v_in_k:
                v = _turn(g, v, self.rotation(rot_v))
            g.expand(g.set_rows(kc, g.reshape(k, head_dim_k * n_head_kv, n_tokens), self.slots))
            if not v_in_k:
                g.expand(g.set_rows(vc, g.reshape(v, head_dim_v * n_head_kv, n_tokens), self.slots))

        rk = ggml.row_size(cache.type_k, head_dim_k)
        rv = rk if v_in_k else ggml.row_size(cache.type_v, head_dim_v)
        if v_in_k:
            vc = kc
        mask = self.masks[layer.mask_kind]
        outs, m_off = [], 0
        for t0, t1, c0, c1, rows in self.calls:
            cells = c1 - c0
            # views already permuted: q [head_dim, rows, n_head], k/v [head_dim, cells, n_head_kv]
            qg = g.view(q, (q.ne[0], t1 - t0, q.ne[1]), (q.nb[2], q.nb[1]), t0 * q.nb[2])
            if rows > t1 - t0:
                qg = g.pad(qg, 0, rows - (t1 - t0))           # dummy rows: keep ggml on the tiled kernel
            kg = g.view(kc, (head_dim_k, cells, n_head_kv), (kc.nb[1], rk), c0 * kc.nb[1])
            vg = g.view(vc, (head_dim_v, cells, n_head_kv), (vc.nb[1], rv), c0 * vc.nb[1])
            mg = g.view(mask, (cells, rows), (cells * 2,), m_off * 2)
            m_off += rows * cells
            o = g.flash_attn(qg, kg, vg, mg, scale, 0.0, softcap, sinks)  # [head_dim_v, n_head, rows]
            if rows > t1 - t0:
                o = g.view(o, (o.ne[0], o.ne[1], t1 - t0), (o.nb[1], o.nb[2]), 0)
            outs.append(o)
        while len(outs) > 1:      # pairwise, so no output is copied more than log2(calls) times
            outs = [g.concat(outs[i], outs[i + 1], 2) if i + 1 < len(outs) else outs[i]
                    for i in range(0, len(outs), 2)]
        out = g.reshape(outs[0], head_dim_v * q.ne[1], n_tokens)
        return _turn(g, out, self.rotation(rot_v)) if rot_v else out


def rotation_values() -> dict[str, np.ndarray]:
    """Values of the Hadamard inputs a step may have declared (KVStep.rotation)."""
    return {f"kv_rot_{n}": hadamard(n) for n in (64, 128, 256, 512)}


def shift_keys(cache, backend, model, c0: int, c1: int, shift: np.ndarray) -> None:
    """Re-rotate the keys of cells c0..c1 by their position change `shift` (int32
    [c1 - c0], 0 for cells that did not move: a rotation by 0 leaves them as they
    are) with the model's rope (`model.shift_k`, None: a layer llama.cpp does not
    shift); a quantized key goes through f32 (and out of and back into its Hadamard
    rotation), as in llama.cpp. Only the roped values of a key row move: all of it, or
    what `model.k_rope_span` names (MLA: the rope dimensions after the compressed KV)."""
    g = backend.graph()
    try:
        t_shift = g.input("k_shift", ggml.I32, (c1 - c0,))
        values = {t_shift: shift.astype(np.int32)}
        hd = model.head_dim
        n_rot = rotation_size(cache.type_k, hd, True)
        rot = g.input(f"kv_rot_{n_rot}", ggml.F32, (n_rot, n_rot)) if n_rot else None
        if n_rot:
            values[rot] = hadamard(n_rot)
        span = getattr(model, "k_rope_span", None)
        for il, kc in enumerate(cache.k):
            if kc is None:
                continue
            lo, width = span(il) if span else (0, cache.layers[il].n_embd_k)
            head = width if span else hd
            off = c0 * kc.nb[1] + ggml.row_size(cache.type_k, lo)
            view = g.view(kc, (width, c1 - c0), (kc.nb[1],), off)
            plain = cache.type_k in _PLAIN
            cur = g.view(kc, (head, width // head, c1 - c0), (ggml.row_size(cache.type_k, head), kc.nb[1]), off) \
                if plain else g.reshape(g.cast(view, ggml.F32), head, width // head, c1 - c0)
            if n_rot:
                cur = _turn(g, cur, rot)
            cur = model.shift_k(g, il, cur, t_shift)
            if cur is None:
                continue
            if n_rot:
                cur = _turn(g, cur, rot)
            g.expand(g.cpy(cur, view))
        backend.compute(g, values)
    finally:
        g.close()
