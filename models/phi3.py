"""Phi-3 / Phi-3.5 text models: fused QKV and fused gate|up projections, LongRoPE.

ref: llama.cpp src/models/phi3.cpp: `attn_qkv` gives q, k, v as views of one
matmul; `ffn_up` is [n_embd, 2 * n_ff], the first half the SiLU gate of the second;
NEOX rope with per-dimension frequency factors (`rope_factors_short`, or
`rope_factors_long` when a sequence's context exceeds the original context, as
llama.cpp's get_rope_factors chooses) and `rope.scaling.attn_factor`; queries are
scaled by 1/sqrt(head_dim) before attention. llama.cpp ignores Phi's sliding
window (disabled there), and so do we.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights


@register("phi3")
class Phi3Model(Decoder):
    rope_type = ggml.ROPE_NEOX
    kq_scale = 1.0

    def __init__(self, meta: dict, tensors: dict, path: str = "", n_ctx_seq: int = 0):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.q_scale = 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        # llama.cpp: the long factors only when the per-sequence context exceeds the original one
        long = n_ctx_seq > self.rope_scaling.n_ctx_orig
        self.rope_factors = w.get(f"rope_factors_{'long' if long else 'short'}.weight", (self.n_rot // 2,),
                                  required=False)
        self.n_q, self.n_kv = self.head_dim * self.n_head, self.head_dim * self.n_head_kv
        e, f = self.n_embd, self.n_ff
        self.layers = [blocks.Layer(w, i, [("attn_norm", "attn_norm.weight", (e,), True),
                                           ("wqkv", "attn_qkv.weight", (e, self.n_q + 2 * self.n_kv), True),
                                           ("wo", "attn_output.weight", (self.n_q, e), True),
                                           ("ffn_norm", "ffn_norm.weight", (e,), True),
                                           ("ffn_up", "ffn_up.weight", (e, 2 * f), True),
                                           ("ffn_down", "ffn_down.weight", (f, e), True)])
                       for i in range(self.n_layer)]

    def qkv(self, g, inp, il, L, h):
        n_tokens, d = inp.n_tokens, self.head_dim
        qkv = inp.mm(g, L.wqkv, h)                                           # [n_q + 2 n_kv, n_tokens]
        row, f = qkv.nb[1], qkv.nb[0]
        q = g.view(qkv, (d, self.n_head, n_tokens), (d * f, row), 0)
        k = g.view(qkv, (d, self.n_head_kv, n_tokens), (d * f, row), self.n_q * f)
        # contiguous for the cache's row copy (llama.cpp's cpy_v takes the strided view: same values)
        v = g.cont(g.view(qkv, (d, self.n_head_kv, n_tokens), (d * f, row), (self.n_q + self.n_kv) * f))
        return q, k, v

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type, self.rope_factors)

    def ffn(self, g, inp, il, L, h):
        up = inp.mm(g, L.ffn_up, h)                                          # [2 n_ff, n_tokens]: gate | up
        m = up.ne[1]
        h = g.swiglu(g.view(up, (self.n_ff, m), (up.nb[1],), 0),
                     g.view(up, (self.n_ff, m), (up.nb[1],), self.n_ff * up.nb[0]))
        return inp.mm(g, L.ffn_down, h)

    def ffn_block(self, g, inp, il, L, x):
        # phi3.cpp adds the FFN's output to the residual in this operand order
        return g.add(x, self.ffn(g, inp, il, L, blocks.norm(g, x, L.ffn_norm, self.eps)))
