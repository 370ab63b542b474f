"""IBM Granite MoE (granitemoe: Granite 3.x MoE, and Granite MoE Shared with a shared
expert beside the routed ones).

ref: llama.cpp src/models/granite-moe.cpp (hparams, tensors) and granite.cpp (the
graph it shares with dense Granite): llama-style attention with NORM RoPE on every
layer, then per layer softmax over the experts, top-k, the chosen weights
normalised to sum 1, SwiGLU experts, plus the shared expert's SwiGLU where
`expert_shared_feed_forward_length` is set.

Granite's scales: token embeddings times `embedding_scale`, attention scaled by
`attention.scale` (else 1/sqrt(head_dim)), every sub-layer's output times
`residual_scale` before its residual add, logits divided by `logit_scale`.
"""
from __future__ import annotations

import numpy as np

from ggserve.models import blocks, moe
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights


@register("granitemoe")
class GraniteMoeModel(Decoder):

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        if self.n_rot != self.head_dim:                                   # llama.cpp asserts it too
            raise ModelError(f"{path}: granitemoe needs rope.dimension_count == head dim ({self.head_dim})")
        self.kq_scale = hp.get("attention.scale", 0.0) or float(np.float32(1) / np.sqrt(np.float32(self.head_dim)))
        self.embd_scale = hp.get("embedding_scale", 0.0) or None
        self.residual_scale = hp.get("residual_scale", 0.0) or None
        self.logit_scale = hp.get("logit_scale", 0.0) or None
        n_expert = hp.get("expert_count", 0)
        self.routing = None
        if n_expert:                                                      # granitemoe without experts is dense Granite
            self.routing = moe.Routing(n_expert, hp.get("expert_used_count", 0), gating=moe.SOFTMAX,
                                       norm_weights=True, weights_scale=hp.get("expert_weights_scale", 0.0))
        self.n_ff_shexp = hp.get("expert_shared_feed_forward_length", 0)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [self._layer(w, i) for i in range(self.n_layer)]

    def _layer(self, w: Weights, i: int) -> blocks.Layer:
        attn = blocks.attention_weights(self, qkv_bias=True, out_bias=False)
        if self.routing is None:
            return blocks.Layer(w, i, attn, blocks.ffn_weights(self))
        L = blocks.Layer(w, i, attn, [("ffn_norm", "ffn_norm.weight", (self.n_embd,), True)])
        L.experts = moe.Experts(w, i, self.n_embd, self.n_ff, self.routing.n_expert)
        L.shexp = blocks.Layer(w, i, blocks.ffn_weights(self, self.n_ff_shexp, norm=None, suffix="_shexp")) \
            if self.n_ff_shexp else None
        return L

    def layer(self, g, inp, il, L, x, temp):
        h = self.attention(g, inp, il, L, blocks.norm(g, x, L.attn_norm, self.eps), temp)
        if il == self.n_layer - 1 and inp.out_ids is not None:
            h = g.get_rows(h, inp.out_ids)
            x = g.get_rows(x, inp.out_ids)
        x = g.add(self._residual(g, h), x)                                 # ffn_inp
        h = self.ffn(g, inp, il, L, blocks.norm(g, x, L.ffn_norm, self.eps))
        return g.add(self._residual(g, h), x)

    def _residual(self, g, h):
        return h if self.residual_scale is None else g.scale(h, self.residual_scale)

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type)

    def ffn(self, g, inp, il, L, h):
        if L.experts is None:
            return blocks.swiglu_ffn(g, inp, L, h)
        out = moe.moe_ffn(g, inp, h, L.experts, self.routing)
        return out if L.shexp is None else g.add(out, blocks.swiglu_ffn(g, inp, L.shexp, h))

    def head(self, g, inp, x):
        logits = super().head(g, inp, x)
        return logits if self.logit_scale is None else g.scale(logits, float(np.float32(1) / np.float32(self.logit_scale)))
