"""Gemma 4 E2B/E4B's per-layer embeddings (PLE): a second, narrow embedding per token
and layer, mixed into each layer's output.

ref: llama.cpp src/models/gemma4-iswa.cpp (build_inp_per_layer,
project_per_layer_inputs, the "per-layer embedding" block of each layer). Per token,
`per_layer_token_embd` holds n_layer slices of n_embd_per_layer values (times
sqrt(n_embd_per_layer)); the scaled input embedding projected by
`per_layer_model_proj` (times 1/sqrt(n_embd), each slice RMS-normed with
`per_layer_proj_norm`) is added and the sum scaled by 1/sqrt(2). Layer il, after its
FFN residual: x + post_norm(proj(gelu(inp_gate x) * slice il)).
"""
from __future__ import annotations

import numpy as np

from ggserve.models import blocks
from ggserve.models.registry import ModelError

_F32 = np.float32


class PerLayerEmbeddings:
    def __init__(self, w, n_embd: int, n_per_layer: int, n_layer: int, eps: float):
        self.n_embd, self.n, self.n_layer, self.eps = n_embd, n_per_layer, n_layer, eps
        n_vocab = w.get("token_embd.weight").ne[1]
        self.tok_embd = w.get("per_layer_token_embd.weight", (n_per_layer * n_layer, n_vocab))
        self.model_proj = w.get("per_layer_model_proj.weight", (n_embd, n_per_layer * n_layer))
        self.proj_norm = w.get("per_layer_proj_norm.weight", (n_per_layer,))
        # the scales as llama.cpp's float math gives them (sqrtf, 1.0f / sqrtf)
        self.tok_scale = float(np.sqrt(_F32(n_per_layer)))
        self.proj_scale = float(_F32(1) / np.sqrt(_F32(n_embd)))
        self.input_scale = float(_F32(1) / np.sqrt(_F32(2)))

    def weights(self) -> list:
        """Each layer's PLE tensors (rows of a blocks.Layer table)."""
        e, p = self.n_embd, self.n
        return [("ple_gate", "inp_gate.weight", (e, p), True),
                ("ple_proj", "proj.weight", (p, e), True),
                ("ple_norm", "post_norm.weight", (e,), True)]

    def inputs(self, g, inp, x):
        """The scaled input embeddings x [n_embd, n_tokens] -> every layer's per-layer
        input [n_per_layer, n_tokens, n_layer]."""
        if inp.images is not None:
            # llama.cpp gives embedding rows the padding token's slices; not done here
            raise ModelError("Gemma 4 per-layer embeddings with image rows are not supported")
        n, p, nl = inp.n_tokens, self.n, self.n_layer
        tok = g.scale(g.reshape(g.get_rows(self.tok_embd, inp.tokens), p, nl, n), self.tok_scale)
        proj = g.reshape(g.scale(g.mul_mat(self.model_proj, x), self.proj_scale), p, nl, n)
        proj = blocks.norm(g, proj, self.proj_norm, self.eps)
        per_layer = g.scale(g.add(proj, tok), self.input_scale)           # [p, n_layer, n_tokens]
        return g.cont(g.permute(per_layer, 0, 2, 1, 3))                   # [p, n_tokens, n_layer]

    def mix(self, g, inp, il: int, L, x, per_layer):
        """Layer il's output x [n_embd, n_tokens] with its per-layer input added."""
        n = per_layer.ne[1]
        gate = g.gelu(inp.mm(g, L.ple_gate, x))                            # [p, n_tokens]
        mine = g.view(per_layer, (self.n, n), (per_layer.nb[1],), il * per_layer.nb[2])
        y = inp.mm(g, L.ple_proj, g.mul(gate, mine))                       # [n_embd, n_tokens]
        return g.add(x, blocks.norm(g, y, L.ple_norm, self.eps))


def shared_kv_sources(swa: list[bool], n_shared: int, path: str) -> list[int]:
    """Per layer, the layer whose K/V it reads: itself, or for the last n_shared layers
    the last earlier layer of its kind (llama.cpp: n_layer_kv_from_start - 2 for a
    sliding-window layer, - 1 for a global one)."""
    n = len(swa)
    start = n - n_shared
    if n_shared <= 0:
        return list(range(n))
    if start < 2 or not swa[start - 2] or swa[start - 1]:
        raise ModelError(f"{path}: {n_shared} shared KV layers need the two layers before them to be "
                         "sliding-window then global")
    return list(range(start)) + [start - (2 if swa[il] else 1) for il in range(start, n)]
