"""OLMo 2 (and OLMo 3, whose files say olmo2 with a sliding window): no pre-norms,
RMS norms on the attention and FFN outputs before each residual add.

ref: llama.cpp src/models/olmo2.cpp. q and k are RMS-normed over their whole width
(all heads at once: weights [n_head*head_dim], [n_head_kv*head_dim]) before the
reshape into heads and NEOX rope; SwiGLU FFN; `output.weight` required. With
`attention.sliding_window` (OLMo 3) every `sliding_window_pattern`-th layer (default
4) is global and the sliding layers rope without frequency scaling.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights

SWA_PATTERN = 4


@register("olmo2")
class Olmo2Model(Decoder):
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        hp.read_linear_rope(self)
        self.rope_base_swa = hp.get("rope.freq_base_swa", self.rope_base)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)
        self.window = hp.get("attention.sliding_window", 0)
        if self.window:
            self.swa_layers = blocks.swa_layers(hp.get("attention.sliding_window_pattern", SWA_PATTERN), self.n_layer)

        w = Weights(tensors, path)
        w.embeddings_and_output(self, tied_output=False)
        n_q, n_kv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        whole_qk_norms = [("q_norm_all", "attn_q_norm.weight", (n_q,), True),
                          ("k_norm_all", "attn_k_norm.weight", (n_kv,), True)]
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, norm=None), whole_qk_norms,
                                    blocks.ffn_weights(self, norm=None), blocks.post_norm_weights(self))
                       for i in range(self.n_layer)]

    def qkv(self, g, inp, il, L, h):
        """Projections, q and k normed over all their heads, then split into heads."""
        n = inp.n_tokens
        q = blocks.norm(g, inp.mm(g, L.wq, h), L.q_norm_all, self.eps)     # [n_head*head_dim, n_tokens]
        k = blocks.norm(g, inp.mm(g, L.wk, h), L.k_norm_all, self.eps)
        v = inp.mm(g, L.wv, h)
        return (g.reshape(q, self.head_dim, self.n_head, n), g.reshape(k, self.head_dim, self.n_head_kv, n),
                g.reshape(v, self.head_dim, self.n_head_kv, n))

    def rope(self, g, il, t, pos):
        if self.swa_layers and self.swa_layers[il]:
            return g.rope(t, pos, self.head_dim, self.rope_type, self.n_ctx_orig, self.rope_base_swa)
        return g.rope(t, pos, self.head_dim, self.rope_type, self.n_ctx_orig, self.rope_base, self.rope_scale)
